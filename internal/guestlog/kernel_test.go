package guestlog

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/ktest"
)

// memoryStat reads one key of a cgroup's memory.stat.
func memoryStat(t *testing.T, cg, key string) int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(cg, "memory.stat"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == key {
			v, _ := strconv.ParseInt(f[1], 10, 64)
			return v
		}
	}
	t.Fatalf("no %s in %s/memory.stat", key, cg)
	return 0
}

// TestKernelShimChargesItsCgroup: the writer started into a cgroup
// (CLONE_INTO_CGROUP) runs there, and the tmpfs pages of the log it writes
// are charged to that cgroup's memory (shmem), i.e. to the sandbox, not to
// ctld. A flood of 40 times the cap leaves the cap, charged there.
func TestKernelShimChargesItsCgroup(t *testing.T) {
	ktest.RequireCgroup2(t, "memory", "pids")
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	dir := t.TempDir() // tmpfs in the test VM, like /run
	cg := filepath.Join(ktest.CgroupRoot, "ctld-guestlog-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.WriteFile(filepath.Join(cg, "cgroup.kill"), []byte("1"), 0o644)
		for i := 0; i < 50; i++ {
			if err := os.Remove(cg); err == nil || os.IsNotExist(err) {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Errorf("remove test cgroup %s", cg)
	})
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	const max = 1 << 20
	w, wr, err := Shim{Argv: []string{self}, Max: max, Env: []string{shimEnv + "=1"}}.Start(dir, cg)
	if err != nil {
		t.Fatal(err)
	}
	procs, _ := os.ReadFile(filepath.Join(cg, "cgroup.procs"))
	if strings.TrimSpace(string(procs)) != strconv.Itoa(wr.Pid) {
		t.Fatalf("cgroup.procs %q, want only the writer %d", procs, wr.Pid)
	}
	shmemBefore := memoryStat(t, cg, "shmem")
	chunk := bytes.Repeat([]byte("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde\n"), 1024)
	for written := 0; written < 40*max; written += len(chunk) {
		if _, err := w.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	// Everything written is in the log once the writer has drained the
	// pipe; it stays alive while a write end is open (here: ours).
	deadline := time.Now().Add(time.Minute)
	for {
		tail, _ := Tail(dir, InitName, max)
		if bytes.HasSuffix(tail, chunk) && len(tail) >= max/2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the writer did not catch up within a minute (%d bytes in the log)", len(tail))
		}
		time.Sleep(50 * time.Millisecond)
	}
	var logBytes int64
	for _, n := range []string{InitName, InitName + OldSuffix} {
		if fi, err := os.Stat(filepath.Join(dir, n)); err == nil {
			logBytes += fi.Size()
		}
	}
	shmem := memoryStat(t, cg, "shmem") - shmemBefore
	t.Logf("wrote %d bytes; log holds %d (cap %d); the writer's cgroup is charged %d bytes of shmem", 40*max, logBytes, max, shmem)
	if logBytes > max {
		t.Fatalf("log holds %d bytes, cap %d", logBytes, max)
	}
	if shmem < logBytes*9/10 || shmem > max+64<<10 {
		t.Fatalf("cgroup charged %d bytes of shmem for a %d-byte log (cap %d): the log's tmpfs pages must be charged to the writer's cgroup, and only the live ones", shmem, logBytes, max)
	}
	w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := wr.Wait(ctx); err != nil {
		t.Fatalf("writer at EOF: %v", err)
	}
}
