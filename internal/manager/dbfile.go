package manager

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// createDBFile creates the SQLite database file at path if it is missing,
// shared with the group of its directory when that directory is
// group-writable (the package's /var/lib/ctl-manager is 2770 root:ctld, so
// operators in group ctld share one database), owner-only otherwise. The
// mode is set with chmod, so neither the caller's umask nor the service's
// UMask=0077 narrows it. SQLite gives the -wal and -shm files it makes the
// database file's mode (and, as root, its owner), so they follow.
func createDBFile(path string) error {
	dir, err := os.Stat(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("stat database dir: %w", err)
	}
	mode := fs.FileMode(0o600)
	if dir.Mode().Perm()&0o070 == 0o070 {
		mode = 0o660
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, mode)
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("create database file: %w", err)
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return fmt.Errorf("chmod database file: %w", err)
	}
	return f.Close()
}
