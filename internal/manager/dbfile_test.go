package manager

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// A database in a group-writable directory (the package's 2770 root:ctld)
// is shared with the group: the file and SQLite's -wal and -shm are 0660
// whatever the umask (ctl-manager.service runs with UMask=0077, a shell
// with 022). In an owner-only directory it stays 0600.
func TestDBFileModeFollowsDirGroup(t *testing.T) {
	for _, tc := range []struct {
		dirMode os.FileMode
		want    os.FileMode
	}{
		{os.ModeSetgid | 0o770, 0o660},
		{0o700, 0o600},
		{0o750, 0o600},
	} {
		for _, umask := range []int{0o077, 0o022} {
			dir := filepath.Join(t.TempDir(), "db")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(dir, tc.dirMode); err != nil {
				t.Fatal(err)
			}
			old := syscall.Umask(umask)
			path := filepath.Join(dir, "manager.db")
			s, err := OpenStore(context.Background(), path, nil)
			syscall.Umask(old)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range []string{path, path + "-wal", path + "-shm"} {
				fi, err := os.Stat(f)
				if err != nil {
					t.Fatal(err)
				}
				if got := fi.Mode().Perm(); got != tc.want {
					t.Errorf("dir %v, umask %#o: %s is %#o, want %#o", tc.dirMode, umask, filepath.Base(f), got, tc.want)
				}
			}
			s.Close()
		}
	}
}
