package lease

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// WriteError is a failed cgroup file write, with the path and value.
type WriteError struct {
	Path  string
	Value string
	Err   error
}

func (e *WriteError) Error() string {
	return fmt.Sprintf("write %s = %q: %v", e.Path, e.Value, e.Err)
}

func (e *WriteError) Unwrap() error { return e.Err }

// rootFS does every file operation relative to an fd of the cgroup root,
// resolved with RESOLVE_BENEATH, so no path (even a bad one that slipped
// past validation, or a symlink) can reach outside the root.
type rootFS struct {
	dir string // absolute root, for messages
	fd  int
}

func openRoot(dir string) (*rootFS, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("open cgroup root: %w: %q is not absolute", ErrInvalid, dir)
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open cgroup root %s: %w", dir, err)
	}
	return &rootFS{dir: dir, fd: fd}, nil
}

func (r *rootFS) Close() error { return unix.Close(r.fd) }

// abs names rel for messages; not cleaned, so a bad rel shows as given.
func (r *rootFS) abs(rel string) string { return strings.TrimSuffix(r.dir, "/") + "/" + rel }

func (r *rootFS) open(rel string, flags int) (int, error) {
	for {
		fd, err := unix.Openat2(r.fd, rel, &unix.OpenHow{
			Flags:   uint64(flags | unix.O_CLOEXEC),
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		if err == unix.EINTR || err == unix.EAGAIN {
			continue // openat2 asks for a retry when a rename raced it
		}
		return fd, err
	}
}

// write writes value in one write(2), as cgroupfs wants.
func (r *rootFS) write(rel, value string) error {
	fd, err := r.open(rel, unix.O_WRONLY|unix.O_TRUNC)
	if err != nil {
		return &WriteError{Path: r.abs(rel), Value: value, Err: err}
	}
	defer unix.Close(fd)
	n, err := unix.Write(fd, []byte(value))
	if err == nil && n != len(value) {
		err = fmt.Errorf("short write %d of %d bytes", n, len(value))
	}
	if err != nil {
		return &WriteError{Path: r.abs(rel), Value: value, Err: err}
	}
	return nil
}

func (r *rootFS) read(rel string) (string, error) {
	fd, err := r.open(rel, unix.O_RDONLY)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", r.abs(rel), err)
	}
	f := os.NewFile(uintptr(fd), r.abs(rel))
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", r.abs(rel), err)
	}
	return string(b), nil
}

// dirs lists the subdirectory names of rel.
func (r *rootFS) dirs(rel string) ([]string, error) {
	fd, err := r.open(rel, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil, fmt.Errorf("open dir %s: %w", r.abs(rel), err)
	}
	f := os.NewFile(uintptr(fd), r.abs(rel))
	defer f.Close()
	ents, err := f.ReadDir(-1)
	if err != nil {
		return nil, fmt.Errorf("read dir %s: %w", r.abs(rel), err)
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// mkdir creates rel's last component inside its (confined) parent.
func (r *rootFS) mkdir(rel string) error {
	dir, base := path.Split(rel)
	pfd, err := r.openDir(dir)
	if err != nil {
		return fmt.Errorf("mkdir %s: %w", r.abs(rel), err)
	}
	defer unix.Close(pfd)
	if err := unix.Mkdirat(pfd, base, 0o755); err != nil {
		return fmt.Errorf("mkdir %s: %w", r.abs(rel), err)
	}
	return nil
}

// rmdir removes rel's last component inside its (confined) parent.
func (r *rootFS) rmdir(rel string) error {
	dir, base := path.Split(rel)
	pfd, err := r.openDir(dir)
	if err != nil {
		return fmt.Errorf("rmdir %s: %w", r.abs(rel), err)
	}
	defer unix.Close(pfd)
	if err := unix.Unlinkat(pfd, base, unix.AT_REMOVEDIR); err != nil {
		return fmt.Errorf("rmdir %s: %w", r.abs(rel), err)
	}
	return nil
}

func (r *rootFS) openDir(rel string) (int, error) {
	if rel == "" {
		rel = "."
	}
	return r.open(rel, unix.O_PATH|unix.O_DIRECTORY)
}

// exists reports whether rel exists; errors other than ENOENT are returned.
func (r *rootFS) exists(rel string) (bool, error) {
	fd, err := r.open(rel, unix.O_PATH)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("stat %s: %w", r.abs(rel), err)
	}
	unix.Close(fd)
	return true, nil
}
