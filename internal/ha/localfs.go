package ha

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/mountinfo"
)

// The election is a flock(2) on <state>/ha/primary.lock, and bbolt locks
// the journal the same way. That is one primary only if flock is a lock of
// the local kernel: on a network or userspace filesystem (NFS, SMB, 9p,
// FUSE, cluster filesystems) the lock is emulated, forwarded or per client,
// so two nodes (or two mounts) could both "hold" it. ctld refuses to start
// there.

// localLockFS are the filesystems whose flock is a local kernel lock.
// Anything else is refused: an unknown filesystem is not assumed safe.
var localLockFS = map[uint32]string{
	unix.EXT4_SUPER_MAGIC:      "ext4", // also ext2, ext3
	unix.XFS_SUPER_MAGIC:       "xfs",
	unix.BTRFS_SUPER_MAGIC:     "btrfs",
	unix.TMPFS_MAGIC:           "tmpfs",
	unix.RAMFS_MAGIC:           "ramfs",
	unix.F2FS_SUPER_MAGIC:      "f2fs",
	0x2fc12fc1:                 "zfs",
	0xca451a4e:                 "bcachefs",
	unix.OVERLAYFS_SUPER_MAGIC: "overlay", // locks are taken on the overlay inode, in this kernel
	0x3153464a:                 "jfs",
	unix.REISERFS_SUPER_MAGIC:  "reiserfs",
	unix.NILFS_SUPER_MAGIC:     "nilfs2",
}

// remoteLockFS names the filesystems refused for a known reason.
var remoteLockFS = map[uint32]string{
	unix.NFS_SUPER_MAGIC:   "nfs",
	unix.SMB_SUPER_MAGIC:   "smb",
	unix.SMB2_SUPER_MAGIC:  "smb2",
	unix.CIFS_SUPER_MAGIC:  "cifs",
	unix.V9FS_MAGIC:        "9p",
	unix.FUSE_SUPER_MAGIC:  "fuse (incl. virtiofs, sshfs, glusterfs)",
	unix.CEPH_SUPER_MAGIC:  "ceph",
	unix.AFS_SUPER_MAGIC:   "afs",
	0x6b414653:             "kafs",
	0x01161970:             "gfs2",
	unix.OCFS2_SUPER_MAGIC: "ocfs2",
	0x0bd00bd0:             "lustre",
	0x47504653:             "gpfs",
	unix.CODA_SUPER_MAGIC:  "coda",
	0x20030528:             "orangefs",
	0x786f4256:             "vboxsf",
}

// localLockNames and remoteLockNames judge the filesystem type as
// mountinfo names it. The statfs magic alone is not enough: 9P2000.L
// reports the server's f_type (a 9p share of an ext4 dir says ext4).
var localLockNames = map[string]bool{
	"ext2": true, "ext3": true, "ext4": true, "xfs": true, "btrfs": true, "tmpfs": true, "ramfs": true,
	"f2fs": true, "zfs": true, "bcachefs": true, "overlay": true, "jfs": true, "reiserfs": true, "nilfs2": true,
}

// LocalLock says whether flock on a filesystem of statfs type fsType is a
// local kernel lock, and names the filesystem.
func LocalLock(fsType int64) (ok bool, name string) {
	t := uint32(fsType)
	if n, ok := localLockFS[t]; ok {
		return true, n
	}
	if n, ok := remoteLockFS[t]; ok {
		return false, n
	}
	return false, fmt.Sprintf("unknown filesystem type 0x%x", t)
}

// LocalLockName says whether flock on a filesystem that mountinfo calls
// name (nfs4, cifs, 9p, fuse.sshfs, virtiofs, ...) is a local kernel lock.
func LocalLockName(name string) bool { return localLockNames[name] }

// fsInfo is what the check looks at: the statfs magic and the mount's
// filesystem type from mountinfo.
type fsInfo struct {
	Magic int64
	Name  string
}

// NonLocalLockError is the refusal to run the election or the journal on a
// filesystem whose flock is not a local kernel lock.
type NonLocalLockError struct {
	Dir    string
	FSType int64
	Name   string
}

func (e *NonLocalLockError) Error() string {
	return fmt.Sprintf("state dir %s is on %s (statfs type 0x%x), where flock is not a local kernel lock: "+
		"two primaries could both hold the election lock; put the state dir on a local filesystem (ext4, xfs, btrfs, tmpfs)",
		e.Dir, e.Name, uint32(e.FSType))
}

// probeFS reads path's statfs magic and, through its mount id (statx),
// the filesystem type mountinfo shows for its mount.
func probeFS(path string) (fsInfo, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return fsInfo{}, fmt.Errorf("statfs %s: %w", path, err)
	}
	info := fsInfo{Magic: int64(st.Type)}
	var sx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, 0, unix.STATX_MNT_ID, &sx); err != nil {
		return info, fmt.Errorf("statx %s: %w", path, err)
	}
	if sx.Mask&unix.STATX_MNT_ID == 0 {
		return info, fmt.Errorf("statx %s: no mount id (kernel older than 5.8)", path)
	}
	ms, err := mountinfo.ReadFile(mountinfo.SelfPath)
	if err != nil {
		return info, err
	}
	for _, m := range ms {
		if uint64(m.ID) == sx.Mnt_id {
			info.Name = m.FSType
			return info, nil
		}
	}
	return info, fmt.Errorf("mount %d of %s not in %s", sx.Mnt_id, path, mountinfo.SelfPath)
}

// CheckLocalLock refuses dir if flock there is not a local kernel lock.
func CheckLocalLock(dir string) error { return checkLocalLock(dir, probeFS) }

// checkLocalLock needs both the mount's type and the statfs magic to be
// local ones.
func checkLocalLock(dir string, probe func(string) (fsInfo, error)) error {
	info, err := probe(dir)
	if err != nil {
		return err
	}
	if ok, name := LocalLock(info.Magic); !ok {
		return &NonLocalLockError{Dir: dir, FSType: info.Magic, Name: name}
	}
	if !LocalLockName(info.Name) {
		return &NonLocalLockError{Dir: dir, FSType: info.Magic, Name: info.Name}
	}
	return nil
}
