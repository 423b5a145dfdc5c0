package lease

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/ktest"
)

// helperEnv makes the test binary, re-executed inside a lease, act as a
// helper process instead of running tests.
const helperEnv = "CTLD_LEASE_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		os.Exit(m.Run())
	case "alloc":
		allocForever()
	case "spin":
		spinForever()
	default:
		fmt.Fprintf(os.Stderr, "unknown helper %q\n", os.Getenv(helperEnv))
		os.Exit(2)
	}
}

// spinForever burns CPU until killed.
func spinForever() {
	for n := uint64(1); n != 0; n++ {
	}
	os.Exit(4)
}

// allocForever touches memory until the kernel OOM-kills the process.
func allocForever() {
	var keep [][]byte
	for {
		b := make([]byte, 4<<20)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		keep = append(keep, b)
		if len(keep) > 1024 { // 4 GiB: memory.max did not hold
			fmt.Println("allocated 4 GiB without being killed")
			os.Exit(3)
		}
	}
}

// kernelManager returns a Manager on a fresh parent that is removed (with
// every lease under it) when the test ends, before the leak check.
func kernelManager(t *testing.T) *Manager {
	t.Helper()
	ktest.RequireCgroup2(t, "cpu", "memory", "pids")
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	m := &Manager{
		Parent:      "ctld-test-" + hex.EncodeToString(b[:]) + ".slice",
		KillTimeout: 10 * time.Second,
		Logger:      slog.New(slog.NewTextHandler(testWriter{t}, nil)),
	}
	ctx := t.Context()
	if err := m.Init(ctx); err != nil {
		t.Fatalf("Init: %v", err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		ids, err := m.List(ctx)
		if err != nil {
			t.Errorf("cleanup: %v", err)
		}
		for _, id := range ids {
			if err := m.Remove(ctx, id); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
		if err := os.Remove(filepath.Join(m.root(), m.Parent)); err != nil {
			t.Errorf("cleanup: remove parent: %v", err)
		}
	})
	return m
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// startIn starts a command directly inside the lease (clone3
// CLONE_INTO_CGROUP), so it is limited from its first instruction.
func startIn(t *testing.T, m *Manager, id string, cmd *exec.Cmd) error {
	t.Helper()
	dir, err := os.Open(m.Dir(id))
	if err != nil {
		t.Fatalf("open lease dir: %v", err)
	}
	defer dir.Close()
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(dir.Fd())}
	return cmd.Start()
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestKernelCreateReadBackRemove(t *testing.T) {
	m := kernelManager(t)
	ctx := t.Context()
	s := Spec{ID: "readback", CPUMillis: 250, MemoryBytes: 64<<20 + 123, PIDs: 32, Cpuset: "0"}
	if err := m.Create(ctx, s); err != nil {
		t.Fatalf("Create: %v", err)
	}
	want := map[string]string{
		"cpu.max":         "25000 100000",
		"cpu.weight":      "25",
		"memory.max":      strconv.Itoa(64 << 20), // rounded down to a page
		"memory.swap.max": "0",
		"pids.max":        "32",
		"cpuset.cpus":     "0",
	}
	for name, v := range want {
		if got := readFile(t, filepath.Join(m.Dir(s.ID), name)); got != v {
			t.Errorf("%s = %q, want %q", name, got, v)
		}
	}
	if err := m.Create(ctx, s); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second Create = %v, want fs.ErrExist", err)
	}
	if got := readFile(t, filepath.Join(m.Dir(s.ID), "pids.max")); got != "32" {
		t.Fatalf("conflicting Create changed the lease: pids.max = %q", got)
	}
	ids, err := m.List(ctx)
	if err != nil || !slices.Equal(ids, []string{"readback"}) {
		t.Fatalf("List = %v, %v", ids, err)
	}
	if ok, detail := m.CheckGone(ctx, s.ID); ok {
		t.Fatalf("CheckGone of a live lease = true (%s)", detail)
	}
	if err := m.Remove(ctx, s.ID); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if ok, detail := m.CheckGone(ctx, s.ID); !ok {
		t.Fatalf("CheckGone after Remove = false: %s", detail)
	}
	if err := m.Remove(ctx, s.ID); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
	if ids, err := m.List(ctx); err != nil || len(ids) != 0 {
		t.Fatalf("List after Remove = %v, %v", ids, err)
	}
	if _, err := m.Stats(ctx, s.ID); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Stats of a removed lease = %v, want fs.ErrNotExist", err)
	}
}

// TestKernelCreateRollsBack asks for a CPU the VM does not have: the kernel
// refuses cpuset.cpus, and Create must leave no cgroup behind.
func TestKernelCreateRollsBack(t *testing.T) {
	m := kernelManager(t)
	ctx := t.Context()
	s := Spec{ID: "rollback", CPUMillis: 100, MemoryBytes: 16 << 20, PIDs: 8, Cpuset: "4000"}
	err := m.Create(ctx, s)
	var we *WriteError
	if !errors.As(err, &we) || we.Value != "4000" || !strings.HasSuffix(we.Path, "/rollback/cpuset.cpus") {
		t.Fatalf("Create with a missing CPU = %v, want a WriteError naming cpuset.cpus and its value", err)
	}
	if ok, detail := m.CheckGone(ctx, s.ID); !ok {
		t.Fatalf("failed Create left the cgroup: %s", detail)
	}
}

func TestKernelPidsMaxEnforced(t *testing.T) {
	m := kernelManager(t)
	ctx := t.Context()
	const limit = 4
	s := Spec{ID: "pids", CPUMillis: 500, MemoryBytes: 128 << 20, PIDs: limit}
	if err := m.Create(ctx, s); err != nil {
		t.Fatalf("Create: %v", err)
	}
	var cmds []*exec.Cmd
	defer func() {
		if err := m.Remove(context.Background(), s.ID); err != nil {
			t.Errorf("Remove: %v", err)
		}
		for _, c := range cmds {
			_ = c.Wait() // reap the killed children
		}
	}()
	// Fill the lease to pids.max from outside: each clone3 into the lease
	// is charged to it.
	for i := range limit {
		c := exec.Command("sleep", "60")
		if err := startIn(t, m, s.ID, c); err != nil {
			t.Fatalf("start process %d of %d in lease: %v", i+1, limit, err)
		}
		cmds = append(cmds, c)
	}
	extra := exec.Command("sleep", "60")
	forkErr := startIn(t, m, s.ID, extra)
	if forkErr == nil {
		cmds = append(cmds, extra)
		t.Fatalf("process %d started in a lease with pids.max=%d", limit+1, limit)
	}
	if !errors.Is(forkErr, syscall.EAGAIN) {
		t.Fatalf("start beyond pids.max: %v, want EAGAIN", forkErr)
	}
	st, err := m.Stats(ctx, s.ID)
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	if st.Procs != limit || st.PIDsCurrent != limit || st.PIDsMaxEvents < 1 {
		t.Fatalf("Stats = %+v, want %d procs, pids.current %d, pids.events max >= 1", st, limit, limit)
	}
	t.Logf("pids.max=%d: fork %d refused with %v; stats %+v", limit, limit+1, forkErr, st)
}

// TestKernelPidsMaxShell shows the limit from inside: a shell in the lease
// cannot fork more children than pids.max allows.
func TestKernelPidsMaxShell(t *testing.T) {
	m := kernelManager(t)
	ctx := t.Context()
	s := Spec{ID: "pids-shell", CPUMillis: 500, MemoryBytes: 128 << 20, PIDs: 4}
	if err := m.Create(ctx, s); err != nil {
		t.Fatalf("Create: %v", err)
	}
	// The shell is 1 task; it tries to fork 8 sleepers into a lease of 4.
	sh := exec.Command("/bin/sh", "-c", `for i in 1 2 3 4 5 6 7 8; do sleep 60 & done; echo all-forked`)
	// A file, not a pipe: the sleepers inherit the shell's output and would
	// keep a pipe (and Wait) open until they exit.
	outFile := filepath.Join(t.TempDir(), "out")
	f, err := os.Create(outFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sh.Stdout, sh.Stderr = f, f
	if err := startIn(t, m, s.ID, sh); err != nil {
		t.Fatalf("start shell in lease: %v", err)
	}
	err = sh.Wait()
	out := readFile(t, outFile)
	if err == nil || strings.Contains(out, "all-forked") {
		t.Fatalf("shell forked 8 children under pids.max=4: err=%v output=%q", err, out)
	}
	st, serr := m.Stats(ctx, s.ID)
	if serr != nil {
		t.Fatalf("Stats: %v", serr)
	}
	if st.PIDsMaxEvents < 1 {
		t.Fatalf("pids.events max = %d, want >= 1", st.PIDsMaxEvents)
	}
	t.Logf("shell: %v, output %q; stats %+v", err, out, st)
	// The sleepers the shell did fork are orphans in the lease; Remove
	// must kill them through cgroup.kill.
	if err := m.Remove(ctx, s.ID); err != nil {
		t.Fatalf("Remove populated lease: %v", err)
	}
	if ok, detail := m.CheckGone(ctx, s.ID); !ok {
		t.Fatalf("CheckGone: %s", detail)
	}
}

// TestKernelBootAllowanceThenSetCPUMax: a lease with a boot allowance
// starts at the allowance's cpu.max (cpu.weight still the claim's), and
// SetCPUMax lowers it live, read back; Stats then shows a spinning process
// using CPU and being throttled at the lowered quota, and its memory peak.
func TestKernelBootAllowanceThenSetCPUMax(t *testing.T) {
	m := kernelManager(t)
	ctx := t.Context()
	s := Spec{ID: "boot", CPUMillis: 20, BootCPUMillis: 1000, MemoryBytes: 64 << 20, PIDs: 16}
	if err := m.Create(ctx, s); err != nil {
		t.Fatalf("Create: %v", err)
	}
	for name, v := range map[string]string{"cpu.max": "100000 100000", "cpu.weight": "2"} {
		if got := readFile(t, filepath.Join(m.Dir(s.ID), name)); got != v {
			t.Errorf("during boot %s = %q, want %q", name, got, v)
		}
	}
	c := exec.Command(os.Args[0])
	c.Env = append(os.Environ(), helperEnv+"=spin")
	if err := startIn(t, m, s.ID, c); err != nil {
		t.Fatalf("start spinner in lease: %v", err)
	}
	t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	if err := m.SetCPUMax(ctx, s.ID, s.CPUMillis); err != nil {
		t.Fatalf("SetCPUMax: %v", err)
	}
	if got := readFile(t, filepath.Join(m.Dir(s.ID), "cpu.max")); got != "2000 100000" {
		t.Fatalf("after SetCPUMax cpu.max = %q, want %q", got, "2000 100000")
	}
	if err := m.SetCPUMax(ctx, "missing", 100); err == nil {
		t.Fatal("SetCPUMax of a missing lease succeeded")
	}
	if err := m.SetCPUMax(ctx, s.ID, 5); !errors.Is(err, ErrInvalid) {
		t.Fatalf("SetCPUMax below the kernel's minimum = %v, want ErrInvalid", err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		st, err := m.Stats(ctx, s.ID)
		if err != nil {
			t.Fatalf("Stats: %v", err)
		}
		if st.NrThrottled >= 3 && st.CPUUsageUsec > 0 && st.MemoryPeak > 0 {
			t.Logf("stats of a spinner at 20m: %+v", st)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a spinner at 20m was not throttled within a minute: %+v", st)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestKernelMemoryMaxOOMKills(t *testing.T) {
	m := kernelManager(t)
	ctx := t.Context()
	s := Spec{ID: "oom", CPUMillis: 1000, MemoryBytes: 48 << 20, PIDs: 64}
	if err := m.Create(ctx, s); err != nil {
		t.Fatalf("Create: %v", err)
	}
	c := exec.Command(os.Args[0])
	c.Env = append(os.Environ(), helperEnv+"=alloc", "GOMEMLIMIT=off", "GOGC=off")
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	if err := startIn(t, m, s.ID, c); err != nil {
		t.Fatalf("start allocator in lease: %v", err)
	}
	err := c.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("allocator ended with %v (output %q), want SIGKILL by the OOM killer", err, out.String())
	}
	st, err := m.Stats(ctx, s.ID)
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	if st.OOMKills < 1 {
		t.Fatalf("Stats.OOMKills = %d, want >= 1 (stats %+v)", st.OOMKills, st)
	}
	t.Logf("memory.max=%d: allocator killed; stats %+v", s.MemoryBytes, st)
}

func TestKernelRemovePopulated(t *testing.T) {
	m := kernelManager(t)
	ctx := t.Context()
	s := Spec{ID: "populated", CPUMillis: 100, MemoryBytes: 64 << 20, PIDs: 16}
	if err := m.Create(ctx, s); err != nil {
		t.Fatalf("Create: %v", err)
	}
	c := exec.Command("/bin/sh", "-c", "sleep 600 & sleep 600 & wait")
	if err := startIn(t, m, s.ID, c); err != nil {
		t.Fatalf("start in lease: %v", err)
	}
	// Wait for the shell's children so there is a process tree to kill.
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := m.Stats(ctx, s.ID)
		if err != nil {
			t.Fatalf("Stats: %v", err)
		}
		if st.Procs == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lease has %d processes, want 3", st.Procs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A child cgroup must not stop Remove either.
	if err := os.Mkdir(filepath.Join(m.Dir(s.ID), "inner"), 0o755); err != nil {
		t.Fatal(err)
	}
	if ok, _ := m.CheckGone(ctx, s.ID); ok {
		t.Fatal("CheckGone = true for a populated lease")
	}
	if err := m.Remove(ctx, s.ID); err != nil {
		t.Fatalf("Remove populated lease: %v", err)
	}
	err := c.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("shell in removed lease ended with %v, want SIGKILL from cgroup.kill", err)
	}
	if ok, detail := m.CheckGone(ctx, s.ID); !ok {
		t.Fatalf("CheckGone after Remove: %s", detail)
	}
	if err := m.Remove(ctx, s.ID); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
}

func TestKernelInitIdempotent(t *testing.T) {
	m := kernelManager(t)
	ctx := t.Context()
	if err := m.Init(ctx); err != nil {
		t.Fatalf("second Init: %v", err)
	}
	ctl := strings.Fields(readFile(t, filepath.Join(m.root(), m.Parent, "cgroup.subtree_control")))
	for _, c := range []string{"cpu", "memory", "pids", "cpuset"} {
		if !slices.Contains(ctl, c) {
			t.Errorf("controller %s not delegated by Init: subtree_control %v", c, ctl)
		}
	}
}

// TestKernelKillEmptiesAndKeeps: Kill ends every process of a lease (a
// process tree, and one in a child cgroup) and returns only once the kernel
// says the lease is empty; the lease and its limits stay for Remove.
func TestKernelKillEmptiesAndKeeps(t *testing.T) {
	m := kernelManager(t)
	ctx := t.Context()
	s := Spec{ID: "killed", CPUMillis: 100, MemoryBytes: 64 << 20, PIDs: 16}
	if err := m.Create(ctx, s); err != nil {
		t.Fatalf("Create: %v", err)
	}
	c := exec.Command("/bin/sh", "-c", "sleep 600 & sleep 600 & wait")
	if err := startIn(t, m, s.ID, c); err != nil {
		t.Fatalf("start in lease: %v", err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if st, err := m.Stats(ctx, s.ID); err != nil || st.Procs == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("lease never had 3 processes")
		}
	}
	if err := m.Kill(ctx, s.ID); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	// Kill returned: the kernel already counts the lease empty.
	if populated, err := m.Populated(ctx, s.ID); err != nil || populated {
		t.Fatalf("Populated after Kill = %v, %v; want an empty lease", populated, err)
	}
	err := c.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("shell in killed lease ended with %v, want SIGKILL from cgroup.kill", err)
	}
	if b, err := os.ReadFile(filepath.Join(m.Dir(s.ID), "pids.max")); err != nil || strings.TrimSpace(string(b)) != "16" {
		t.Fatalf("lease after Kill: pids.max %q, %v; want the lease kept with its limits", b, err)
	}
	if ok, _ := m.CheckGone(ctx, s.ID); ok {
		t.Fatal("CheckGone = true for a lease Kill must keep")
	}
	if err := m.Kill(ctx, s.ID); err != nil {
		t.Fatalf("Kill of an empty lease: %v", err)
	}
	if err := m.Remove(ctx, s.ID); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if err := m.Kill(ctx, s.ID); err != nil {
		t.Fatalf("Kill of a removed lease: %v", err)
	}
	if err := m.Kill(ctx, "../x"); err == nil {
		t.Fatal("Kill of an invalid id succeeded")
	}
}
