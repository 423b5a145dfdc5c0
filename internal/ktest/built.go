package ktest

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BinDirEnv names the dir the VM harness (test/vm/vmrun) builds the
// project's binaries into on the host: ctld, ctl-manager, ctl-agent and
// the e2e tests' hostile agent.
const BinDirEnv = "CTLD_BIN_DIR"

// RequireBuilt fails unless the VM harness built name into $CTLD_BIN_DIR,
// returning its path.
func RequireBuilt(t testing.TB, name string) string {
	t.Helper()
	Require(t)
	dir := os.Getenv(BinDirEnv)
	p := filepath.Join(dir, name)
	if _, err := os.Stat(p); dir == "" || err != nil {
		t.Fatalf("%s binary not found (%s=%q): %v; run through make test-vm", name, BinDirEnv, dir, err)
	}
	return p
}

// StopProcess ends a process the test started and waits for it: SIGTERM,
// then SIGKILL if it has not exited within grace, which fails the test
// (ctld hands over on SIGTERM; ignoring it is a bug).
func StopProcess(t testing.TB, cmd *exec.Cmd, name string, grace time.Duration) {
	t.Helper()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		t.Errorf("%s ignored SIGTERM for %v; killing", name, grace)
		_ = cmd.Process.Kill()
		<-done
	}
}

// MakeCgroup makes the cgroup name under CgroupRoot, as a lease does (a
// pre-created directory runsc joins), returning its directory; the
// test's end removes it, retrying while it is busy (a sandbox's
// processes leave it a moment after runsc returns).
func MakeCgroup(t testing.TB, name string) string {
	t.Helper()
	dir := filepath.Join(CgroupRoot, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("create lease cgroup: %v", err)
	}
	t.Cleanup(func() {
		for i := 0; ; i++ {
			err := unix.Rmdir(dir)
			if err == nil || errors.Is(err, unix.ENOENT) {
				return
			}
			if !errors.Is(err, unix.EBUSY) || i == 100 {
				procs, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
				t.Errorf("remove lease cgroup: %v (procs %q)", err, procs)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	return dir
}
