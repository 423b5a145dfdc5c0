// Package fsutil holds durable file writes: state that failover relies on is
// written to a temp file in the same directory, fsynced, renamed into place,
// and the directory is fsynced, so a crash leaves either the old or the new
// content, never a torn file.
package fsutil

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// WriteFileAtomic replaces path with data durably. perm applies to the new
// file (the umask does not narrow it, so 0600 key files stay 0600).
func WriteFileAtomic(path string, data []byte, perm os.FileMode) (err error) {
	dir, tmp, err := writeTemp(path, data, perm)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename %s to %s: %w", tmp, path, err)
	}
	// The rename is durable only once the directory entry is on disk.
	if err := SyncDir(dir); err != nil {
		return err
	}
	return nil
}

// CreateFileOnce durably creates path with data unless it already exists;
// an existing file is never replaced (the error then wraps fs.ErrExist).
// The content appears complete or not at all: it is written to a temp file,
// fsynced and hard-linked into place, and link(2) fails if path exists, so
// two racing creators cannot both win.
func CreateFileOnce(path string, data []byte, perm os.FileMode) (err error) {
	dir, tmp, err := writeTemp(path, data, perm)
	if err != nil {
		return err
	}
	// The temp name goes in every case: on success path is the second link.
	defer func() {
		if rmErr := os.Remove(tmp); rmErr != nil && !errors.Is(rmErr, fs.ErrNotExist) && err == nil {
			err = fmt.Errorf("remove temp file %s: %w", tmp, rmErr)
		}
	}()
	if err := os.Link(tmp, path); err != nil {
		return fmt.Errorf("link %s to %s: %w", tmp, path, err)
	}
	return SyncDir(dir)
}

// writeTemp writes data durably to a new temp file beside path (removed
// again on failure) and returns path's directory and the temp file's name.
func writeTemp(path string, data []byte, perm os.FileMode) (dir, tmp string, err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return "", "", fmt.Errorf("create temp file for %s: %w", path, err)
	}
	if err := writeSyncClose(f, data, perm); err != nil {
		_ = os.Remove(f.Name())
		return "", "", err
	}
	return dir, f.Name(), nil
}

func writeSyncClose(f *os.File, data []byte, perm os.FileMode) error {
	name := f.Name()
	err := func() error {
		if err := f.Chmod(perm); err != nil {
			return fmt.Errorf("chmod temp file %s: %w", name, err)
		}
		if _, err := f.Write(data); err != nil {
			return fmt.Errorf("write temp file %s: %w", name, err)
		}
		if err := f.Sync(); err != nil {
			return fmt.Errorf("fsync temp file %s: %w", name, err)
		}
		return nil
	}()
	if err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close temp file %s: %w", name, err)
	}
	return nil
}

// SyncDir fsyncs a directory so entries created or renamed in it survive a
// crash.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open dir %s: %w", dir, err)
	}
	if err := d.Sync(); err != nil {
		return errors.Join(fmt.Errorf("fsync dir %s: %w", dir, err), d.Close())
	}
	if err := d.Close(); err != nil {
		return fmt.Errorf("close dir %s: %w", dir, err)
	}
	return nil
}

// LoadOrCreate reads path, or, when it is missing, creates it once with
// gen's data (CreateFileOnce: a crash leaves it complete or absent, and
// of racing creators one wins and the others read its file). read reads
// the file (os.ReadFile, or ReadPrivate for a key).
func LoadOrCreate(path string, perm os.FileMode, read func(string) ([]byte, error), gen func() ([]byte, error)) ([]byte, error) {
	b, err := read(path)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return b, err
	}
	data, err := gen()
	if err != nil {
		return nil, fmt.Errorf("generate %s: %w", path, err)
	}
	if err := CreateFileOnce(path, data, perm); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("create %s: %w", path, err)
	}
	return read(path)
}

// MaxPrivateFile bounds a key file ReadPrivate reads.
const MaxPrivateFile = 64 << 10

// ReadPrivate reads a secret (a key file): a regular file that neither
// group nor others can access (a key others can read can sign or
// decrypt in the node's name), of at most MaxPrivateFile bytes. The mode
// is checked on the open file, so a swap after the check is read as
// what it is.
func ReadPrivate(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("read %s: mode %v, want a regular file of mode 0600 (chmod 600 it)", path, st.Mode())
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxPrivateFile+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(b) > MaxPrivateFile {
		return nil, fmt.Errorf("read %s: over %d bytes", path, MaxPrivateFile)
	}
	return b, nil
}
