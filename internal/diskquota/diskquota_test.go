package diskquota

import (
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestABISizes: the structs passed to the kernel have the sizes of their C
// counterparts (a wrong size is memory corruption, not an error).
func TestABISizes(t *testing.T) {
	for name, c := range map[string]struct{ got, want uintptr }{
		"struct fsxattr":        {unsafe.Sizeof(fsxattr{}), 28},
		"struct if_dqblk":       {unsafe.Sizeof(ifDqblk{}), 72},
		"struct if_nextdqblk":   {unsafe.Sizeof(ifNextDqblk{}), 72},
		"struct fs_quota_statv": {unsafe.Sizeof(fsQuotaStatV{}), 160},
	} {
		if c.got != c.want {
			t.Errorf("%s: Go size %d, kernel size %d", name, c.got, c.want)
		}
	}
	// The ioctl numbers encode the struct size.
	if fsIocFSGetXattr>>16&0x3fff != 28 || fsIocFSSetXattr>>16&0x3fff != 28 {
		t.Errorf("FS_IOC_FS[GS]ETXATTR do not encode a 28-byte struct: %#x %#x", fsIocFSGetXattr, fsIocFSSetXattr)
	}
}

func TestFSTypeName(t *testing.T) {
	for typ, want := range map[int64]string{unix.XFS_SUPER_MAGIC: "xfs", unix.TMPFS_MAGIC: "tmpfs", unix.V9FS_MAGIC: "9p", 0x1234: "0x1234"} {
		if got := FSTypeName(typ); got != want {
			t.Errorf("FSTypeName(%#x) = %q, want %q", typ, got, want)
		}
	}
}

func TestQuotaEmpty(t *testing.T) {
	if !(Quota{ID: 7}).Empty() || (Quota{ID: 7, UsedInodes: 1}).Empty() || (Quota{LimitBytes: 1024}).Empty() {
		t.Fatal("Empty must be true only without limits and usage")
	}
}

// TestQCMD: commands carry the project quota type in the low byte, as
// QCMD(cmd, PRJQUOTA) does (a bare subcommand reads as type 7: EINVAL).
func TestQCMD(t *testing.T) {
	for sub, want := range map[uint32]uint32{qGetQuota: 0x80000702, qSetQuota: 0x80000802, qGetNextQuot: 0x80000902, qXGetQStatV: 0x580802} {
		if got := qcmd(sub); got != want {
			t.Errorf("qcmd(%#x) = %#x, want %#x", sub, got, want)
		}
	}
}
