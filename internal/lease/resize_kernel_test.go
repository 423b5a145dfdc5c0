package lease

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// TestKernelResizeLive: a lease made with a warm member's small neutral
// limits and already populated takes a claim's limits live (issue 27):
// every file reads back the claim's value, and the new memory.max holds
// against an allocator started after it (the lease's memory peak stays
// under the new limit, below the member's).
func TestKernelResizeLive(t *testing.T) {
	m := kernelManager(t)
	ctx := t.Context()
	member := Spec{ID: "warm-member", CPUMillis: 100, MemoryBytes: 96 << 20, PIDs: 32}
	if err := m.Create(ctx, member); err != nil {
		t.Fatalf("Create: %v", err)
	}
	spin := exec.Command(os.Args[0])
	spin.Env = append(os.Environ(), helperEnv+"=spin")
	if err := startIn(t, m, member.ID, spin); err != nil {
		t.Fatalf("start spinner in lease: %v", err)
	}
	t.Cleanup(func() { _ = spin.Process.Kill(); _ = spin.Wait() })

	claim := Spec{ID: member.ID, CPUMillis: 250, MemoryBytes: 48 << 20, PIDs: 20, Cpuset: "0"}
	if err := m.Resize(ctx, claim); err != nil {
		t.Fatalf("Resize: %v", err)
	}
	for name, v := range map[string]string{"cpu.max": "25000 100000", "cpu.weight": "25", "memory.max": "50331648", "pids.max": "20", "cpuset.cpus": "0", "memory.swap.max": "0"} {
		if got := readFile(t, filepath.Join(m.Dir(member.ID), name)); got != v {
			t.Errorf("after Resize %s = %q, want %q", name, got, v)
		}
	}
	alloc := exec.Command(os.Args[0])
	alloc.Env = append(os.Environ(), helperEnv+"=alloc", "GOMEMLIMIT=off", "GOGC=off")
	if err := startIn(t, m, member.ID, alloc); err != nil {
		t.Fatalf("start allocator in lease: %v", err)
	}
	err := alloc.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("allocator ended with %v, want SIGKILL by the OOM killer", err)
	}
	st, err := m.Stats(ctx, member.ID)
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	// The kernel lets a charge pass the limit by a page or so before it
	// reclaims or kills: a peak near the new limit, far under the old.
	if st.OOMKills < 1 || st.MemoryPeak > claim.MemoryBytes+1<<20 {
		t.Fatalf("after Resize: OOM kills %d, memory peak %d; want >= 1 kill and a peak within the new %d (the member's was %d)", st.OOMKills, st.MemoryPeak, claim.MemoryBytes, member.MemoryBytes)
	}
	if err := m.Resize(ctx, Spec{ID: "missing", CPUMillis: 100, MemoryBytes: 64 << 20, PIDs: 8}); err == nil {
		t.Error("Resize of a missing lease succeeded")
	}
	if err := m.Resize(ctx, Spec{ID: member.ID, CPUMillis: 5, MemoryBytes: 64 << 20, PIDs: 8}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Resize below the kernel's minimum = %v, want ErrInvalid", err)
	}
}
