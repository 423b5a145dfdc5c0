// Package diskquota bounds the disk use of a directory tree with a project
// quota (XFS; ext4's project quotas exempt root), through quotactl_fd(2) and
// FS_IOC_FSSETXATTR: a directory gets a project id with PROJINHERIT, so
// everything created below it is charged to that project, and the project
// gets a hard block and inode limit the kernel enforces on every write.
//
// Every call takes a path on the filesystem in question (any file or
// directory on it); nothing needs the block device's name.
package diskquota

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Kernel ABI not in golang.org/x/sys/unix (include/uapi/linux/fs.h,
// include/uapi/linux/quota.h, include/uapi/linux/dqblk_xfs.h).
const (
	fsIocFSGetXattr    = 0x801c581f // _IOR('X', 31, struct fsxattr)
	fsIocFSSetXattr    = 0x401c5820 // _IOW('X', 32, struct fsxattr)
	fsXflagProjInherit = 0x00000200

	prjQuota     = 2
	qGetQuota    = 0x800007
	qSetQuota    = 0x800008
	qGetNextQuot = 0x800009
	qXGetQStatV  = 'X'<<8 | 8

	qifBLimits = 1
	qifILimits = 4
	qifLimits  = qifBLimits | qifILimits
	dqBlkSize  = 1024 // QIF_DQBLKSIZE: the unit of if_dqblk's block limits

	fsQStatVVersion1 = 1
	fsQuotaPDQAcct   = 1 << 4
	fsQuotaPDQEnfd   = 1 << 5
)

type fsxattr struct {
	Xflags     uint32
	Extsize    uint32
	Nextents   uint32
	Projid     uint32
	Cowextsize uint32
	_          [8]byte
}

type ifDqblk struct {
	BHardLimit uint64
	BSoftLimit uint64
	CurSpace   uint64
	IHardLimit uint64
	ISoftLimit uint64
	CurInodes  uint64
	BTime      uint64
	ITime      uint64
	Valid      uint32
	_          uint32
}

type ifNextDqblk struct {
	ifDqblkNoPad
	Valid uint32
	ID    uint32
}

type ifDqblkNoPad struct {
	BHardLimit, BSoftLimit, CurSpace, IHardLimit, ISoftLimit, CurInodes, BTime, ITime uint64
}

type fsQfileStatV struct {
	Ino      uint64
	Nblks    uint64
	Nextents uint32
	_        uint32
}

type fsQuotaStatV struct {
	Version      int8
	_            uint8
	Flags        uint16
	Incoredqs    uint32
	UQuota       fsQfileStatV
	GQuota       fsQfileStatV
	PQuota       fsQfileStatV
	BTimeLimit   int32
	ITimeLimit   int32
	RTBTimeLimit int32
	BWarnLimit   uint16
	IWarnLimit   uint16
	RTBWarnLimit uint16
	_            uint16
	_            uint32
	_            [7]uint64
}

// Status says whether a filesystem can bound a directory tree.
type Status struct {
	FSType     string // e.g. "xfs", "ext4", "tmpfs"
	Accounting bool   // project quota accounting is on
	Enforcing  bool   // project quota limits are enforced
	// RootExempt: the limits do not bind writers with CAP_SYS_RESOURCE
	// (the generic VFS quota of ext4 and others ignores hard limits for
	// them; XFS does not), so a root gofer could write past them.
	RootExempt bool
	Detail     string // why not, when not
}

// Bounded reports whether project limits are enforced on every writer.
func (s Status) Bounded() bool { return s.Accounting && s.Enforcing && !s.RootExempt }

// Quota is one project's limits and usage. Zero limits mean none.
type Quota struct {
	ID          uint32
	LimitBytes  uint64
	LimitInodes uint64
	UsedBytes   uint64
	UsedInodes  uint64
}

// Empty reports whether the project has neither a limit nor any usage.
func (q Quota) Empty() bool {
	return q.LimitBytes == 0 && q.LimitInodes == 0 && q.UsedBytes == 0 && q.UsedInodes == 0
}

// FSTypeName names common statfs f_type magics.
func FSTypeName(t int64) string {
	switch uint32(t) {
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	case unix.EXT4_SUPER_MAGIC:
		return "ext4"
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	case unix.OVERLAYFS_SUPER_MAGIC:
		return "overlay"
	case unix.V9FS_MAGIC:
		return "9p"
	case unix.NFS_SUPER_MAGIC:
		return "nfs"
	case unix.FUSE_SUPER_MAGIC:
		return "fuse"
	case unix.CIFS_SUPER_MAGIC, unix.SMB2_SUPER_MAGIC, unix.SMB_SUPER_MAGIC:
		return "smb"
	case unix.CEPH_SUPER_MAGIC:
		return "ceph"
	}
	return fmt.Sprintf("0x%x", uint32(t))
}

// qcmd is QCMD(sub, PRJQUOTA): the subcommand above the quota type.
func qcmd(sub uint32) uint32 { return sub<<8 | prjQuota }

// quotactl runs quotactl_fd(2) with QCMD(sub, PRJQUOTA) on path's filesystem.
func quotactl(path string, sub uint32, id uint32, addr unsafe.Pointer) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, _, e := unix.Syscall6(unix.SYS_QUOTACTL_FD, f.Fd(), uintptr(qcmd(sub)), uintptr(id), uintptr(addr), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// Probe says whether the filesystem holding path enforces project quotas.
func Probe(path string) (Status, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return Status{}, fmt.Errorf("statfs %s: %w", path, err)
	}
	s := Status{FSType: FSTypeName(st.Type)}
	v := fsQuotaStatV{Version: fsQStatVVersion1}
	err := quotactl(path, qXGetQStatV, 0, unsafe.Pointer(&v))
	switch {
	case errors.Is(err, unix.ENOSYS), errors.Is(err, unix.ENOTTY), errors.Is(err, unix.EINVAL), errors.Is(err, unix.EOPNOTSUPP):
		s.Detail = fmt.Sprintf("%s has no project quota support (quotactl: %v)", s.FSType, err)
		return s, nil
	case err != nil:
		return s, fmt.Errorf("quotactl Q_XGETQSTATV on %s: %w", path, err)
	}
	s.Accounting = v.Flags&fsQuotaPDQAcct != 0
	s.Enforcing = v.Flags&fsQuotaPDQEnfd != 0
	switch {
	case !s.Accounting:
		s.Detail = fmt.Sprintf("%s is mounted without project quota accounting", s.FSType)
	case !s.Enforcing:
		s.Detail = fmt.Sprintf("%s accounts project quotas but does not enforce them", s.FSType)
	case st.Type != unix.XFS_SUPER_MAGIC:
		s.RootExempt = true
		s.Detail = fmt.Sprintf("%s project quotas do not bind writers with CAP_SYS_RESOURCE (root, as runsc's gofer may be); only XFS enforces them on root", s.FSType)
	}
	return s, nil
}

// Project returns dir's project id and whether it has PROJINHERIT.
func Project(dir string) (id uint32, inherit bool, err error) {
	f, err := os.Open(dir)
	if err != nil {
		return 0, false, err
	}
	defer f.Close()
	var x fsxattr
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fsIocFSGetXattr, uintptr(unsafe.Pointer(&x))); e != 0 {
		return 0, false, fmt.Errorf("FS_IOC_FSGETXATTR %s: %w", dir, e)
	}
	return x.Projid, x.Xflags&fsXflagProjInherit != 0, nil
}

// SetProject gives dir project id with PROJINHERIT, so files and dirs made
// below it from now on are charged to the project. Set it on an empty dir:
// what already exists below keeps its old project.
func SetProject(dir string, id uint32) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	var x fsxattr
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fsIocFSGetXattr, uintptr(unsafe.Pointer(&x))); e != 0 {
		return fmt.Errorf("FS_IOC_FSGETXATTR %s: %w", dir, e)
	}
	x.Projid = id
	x.Xflags |= fsXflagProjInherit
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fsIocFSSetXattr, uintptr(unsafe.Pointer(&x))); e != 0 {
		return fmt.Errorf("FS_IOC_FSSETXATTR %s (project %d): %w", dir, id, e)
	}
	return nil
}

// Get returns project id's limits and usage on path's filesystem. A
// project the filesystem has never seen is an empty Quota.
func Get(path string, id uint32) (Quota, error) {
	var d ifDqblk
	err := quotactl(path, qGetQuota, id, unsafe.Pointer(&d))
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) {
		return Quota{ID: id}, nil
	}
	if err != nil {
		return Quota{}, fmt.Errorf("quotactl Q_GETQUOTA project %d on %s: %w", id, path, err)
	}
	return Quota{ID: id, LimitBytes: d.BHardLimit * dqBlkSize, LimitInodes: d.IHardLimit, UsedBytes: d.CurSpace, UsedInodes: d.CurInodes}, nil
}

// SetLimit sets project id's hard (and soft) block and inode limits; zero
// removes a limit. Bytes are rounded up to the kernel's 1 KiB unit.
func SetLimit(path string, id uint32, bytes, inodes uint64) error {
	blocks := (bytes + dqBlkSize - 1) / dqBlkSize
	d := ifDqblk{BHardLimit: blocks, BSoftLimit: blocks, IHardLimit: inodes, ISoftLimit: inodes, Valid: qifLimits}
	if err := quotactl(path, qSetQuota, id, unsafe.Pointer(&d)); err != nil {
		return fmt.Errorf("quotactl Q_SETQUOTA project %d on %s (%d bytes, %d inodes): %w", id, path, bytes, inodes, err)
	}
	return nil
}

// List returns the projects with ids in [from, to) that have a limit or
// usage on path's filesystem, in id order.
func List(path string, from, to uint32) ([]Quota, error) {
	var out []Quota
	for id := from; id < to; {
		var d ifNextDqblk
		err := quotactl(path, qGetNextQuot, id, unsafe.Pointer(&d))
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) {
			break // no project at or after id
		}
		if err != nil {
			return out, fmt.Errorf("quotactl Q_GETNEXTQUOTA from project %d on %s: %w", id, path, err)
		}
		if d.ID >= to || d.ID < id {
			break
		}
		q := Quota{ID: d.ID, LimitBytes: d.BHardLimit * dqBlkSize, LimitInodes: d.IHardLimit, UsedBytes: d.CurSpace, UsedInodes: d.CurInodes}
		if !q.Empty() {
			out = append(out, q)
		}
		if d.ID == ^uint32(0) {
			break
		}
		id = d.ID + 1
	}
	return out, nil
}
