package ha

import (
	"errors"
	"os"
	"testing"

	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/mountinfo"
)

// ninePMount returns a writable 9p mount point of the test VM (the
// harness's results share), or fails.
func ninePMount(t *testing.T) string {
	t.Helper()
	ms, err := mountinfo.ReadFile(mountinfo.SelfPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.FSType == "9p" {
			if _, err := os.Stat(m.MountPoint); err == nil {
				return m.MountPoint
			}
		}
	}
	t.Fatal("no 9p mount in the test VM (the harness shares its results dir over 9p)")
	return ""
}

// TestKernelLocalLockRealFilesystems: the real statfs of the VM's tmpfs
// and XFS state disk passes; its 9p share is refused, naming 9p.
func TestKernelLocalLockRealFilesystems(t *testing.T) {
	ktest.Require(t)
	for _, dir := range []string{t.TempDir(), "/var/lib/ctld"} {
		if err := CheckLocalLock(dir); err != nil {
			t.Errorf("CheckLocalLock(%s): %v", dir, err)
		}
	}
	dir := ninePMount(t)
	err := CheckLocalLock(dir)
	var nl *NonLocalLockError
	if !errors.As(err, &nl) || nl.Name != "9p" {
		t.Fatalf("CheckLocalLock(%s) on 9p = %v; want a NonLocalLockError naming 9p", dir, err)
	}
	t.Logf("refused: %v", err)
}
