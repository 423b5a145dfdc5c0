package ha

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestLocalLockVerdicts: the decision is plain data, statfs type → verdict.
func TestLocalLockVerdicts(t *testing.T) {
	for _, c := range []struct {
		fsType int64
		ok     bool
		name   string
	}{
		{unix.EXT4_SUPER_MAGIC, true, "ext4"},
		{unix.XFS_SUPER_MAGIC, true, "xfs"},
		{unix.BTRFS_SUPER_MAGIC, true, "btrfs"},
		{unix.TMPFS_MAGIC, true, "tmpfs"},
		{unix.OVERLAYFS_SUPER_MAGIC, true, "overlay"},
		{unix.NFS_SUPER_MAGIC, false, "nfs"},
		{unix.CIFS_SUPER_MAGIC, false, "cifs"},
		{unix.SMB2_SUPER_MAGIC, false, "smb2"},
		{unix.V9FS_MAGIC, false, "9p"},
		{unix.FUSE_SUPER_MAGIC, false, "fuse (incl. virtiofs, sshfs, glusterfs)"},
		{unix.CEPH_SUPER_MAGIC, false, "ceph"},
		{0x01161970, false, "gfs2"},
		{0x0bd00bd0, false, "lustre"},
		{0x12345678, false, "unknown filesystem type 0x12345678"},
	} {
		ok, name := LocalLock(c.fsType)
		if ok != c.ok || name != c.name {
			t.Errorf("LocalLock(%#x) = %v, %q; want %v, %q", c.fsType, ok, name, c.ok, c.name)
		}
	}
}

// TestWaitPrimaryRefusesNonLocalLock: on a filesystem whose flock is not a
// local kernel lock the election refuses before it takes the lock or bumps
// the epoch, and says which filesystem.
func TestWaitPrimaryRefusesNonLocalLock(t *testing.T) {
	dir := t.TempDir()
	e := &Elector{StateDir: dir, Slot: "a", probeFS: func(string) (fsInfo, error) { return fsInfo{Magic: unix.NFS_SUPER_MAGIC, Name: "nfs4"}, nil }}
	term, err := e.WaitPrimary(context.Background())
	var nl *NonLocalLockError
	if !errors.As(err, &nl) || term != nil {
		t.Fatalf("WaitPrimary on nfs: term %v, err %v; want a NonLocalLockError", term, err)
	}
	if !strings.Contains(err.Error(), "nfs") || !strings.Contains(err.Error(), "not a local kernel lock") {
		t.Fatalf("error does not name the filesystem and the reason: %v", err)
	}
	if _, err := os.Stat(LockPath(dir)); !os.IsNotExist(err) {
		t.Fatalf("lock file made on a refused filesystem: %v", err)
	}
	if _, err := os.Stat(EpochPath(dir)); !os.IsNotExist(err) {
		t.Fatalf("epoch written on a refused filesystem: %v", err)
	}
	// The real statfs of this test's temp dir (a local filesystem) passes.
	if err := CheckLocalLock(dir); err != nil {
		t.Fatalf("CheckLocalLock(%s): %v", dir, err)
	}
}

// TestLocalLockNeedsBoth: a 9P2000.L share reports the server's statfs
// magic (ext4 here); the mount's type (9p) still refuses it. Either
// signal being non-local refuses.
func TestLocalLockNeedsBoth(t *testing.T) {
	for _, c := range []struct {
		info fsInfo
		ok   bool
	}{
		{fsInfo{unix.EXT4_SUPER_MAGIC, "ext4"}, true},
		{fsInfo{unix.XFS_SUPER_MAGIC, "xfs"}, true},
		{fsInfo{unix.EXT4_SUPER_MAGIC, "9p"}, false},
		{fsInfo{unix.EXT4_SUPER_MAGIC, "fuse.sshfs"}, false},
		{fsInfo{unix.EXT4_SUPER_MAGIC, "virtiofs"}, false},
		{fsInfo{unix.EXT4_SUPER_MAGIC, "nfs4"}, false},
		{fsInfo{unix.NFS_SUPER_MAGIC, "ext4"}, false},
	} {
		err := checkLocalLock("/x", func(string) (fsInfo, error) { return c.info, nil })
		if (err == nil) != c.ok {
			t.Errorf("%+v: %v, want ok=%v", c.info, err, c.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "not a local kernel lock") {
			t.Errorf("%+v: unclear error %v", c.info, err)
		}
	}
}
