package dirstore

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/fsutil"
)

// fsOps are the file system calls that decide what a crash leaves of the
// store's writes: Put and Batch make them in the order that keeps every
// visible object whole. A test swaps in a recorder (crash_test.go) that
// replays every crash point.
type fsOps interface {
	// writeTemp writes data to a new hidden temp file in dir (named from
	// base) and returns its path; sync fsyncs its data before it returns.
	writeTemp(dir, base string, data []byte, sync bool) (string, error)
	// link makes path a second name of the temp file tmp; EEXIST when
	// path exists (link(2) never replaces).
	link(tmp, path string) error
	// createTemp creates a new hidden temp file in dir (named from base)
	// for a pack's appends; syncFile of its name makes them durable.
	createTemp(dir, base string) (*os.File, error)
	remove(p string) error
	// mkdir creates the directory dir (0700); fs.ErrExist if it exists.
	mkdir(dir string) error
	// syncFile makes the data of the file at p durable.
	syncFile(p string) error
	// syncDir makes dir's entries durable.
	syncDir(dir string) error
	// syncFS makes everything written to the file system holding root
	// durable: data and names (syncfs(2)).
	syncFS(root string) error
}

type osOps struct{}

func (osOps) writeTemp(dir, base string, data []byte, sync bool) (string, error) {
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return "", fmt.Errorf("create temp file in %s: %w", dir, err)
	}
	name := f.Name()
	_, err = f.Write(data)
	if err == nil && sync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(name)
		return "", fmt.Errorf("write temp file %s: %w", name, err)
	}
	return name, nil
}

func (osOps) link(tmp, path string) error { return os.Link(tmp, path) }

func (osOps) createTemp(dir, base string) (*os.File, error) {
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return nil, fmt.Errorf("create temp file in %s: %w", dir, err)
	}
	return f, nil
}

func (osOps) mkdir(dir string) error { return os.Mkdir(dir, 0o700) }

func (osOps) remove(p string) error {
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

func (osOps) syncDir(dir string) error { return fsutil.SyncDir(dir) }

func (osOps) syncFile(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("fsync %s: %w", p, err)
	}
	return nil
}

func (osOps) syncFS(root string) error {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", root, err)
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return fmt.Errorf("syncfs %s: %w", root, err)
	}
	return nil
}
