package node

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/ktest"
)

// TestKernelRunscStartBound: a guest whose sandbox stops before `runsc
// start` (its lease frozen: runsc start then waits on the sandbox for
// ever, as the claim at --runtime-pids 0 of issue 21 hung 10 minutes
// past --ready-timeout) fails its claim at the ready timeout, saying runsc
// start timed out; the guest is killed through its lease, the rollback's
// proof is clean, nothing leaks, and the next generation is ready.
func TestKernelRunscStartBound(t *testing.T) {
	ktest.Require(t)
	k := realKernel(t)
	k.readyTimeout = time.Minute
	k.timeout = 5 * time.Minute
	freeze := func(t testing.TB, cid string) {
		if err := os.WriteFile(filepath.Join(k.leases.Dir(cid), "cgroup.freeze"), []byte("1"), 0); err != nil {
			t.Fatalf("freeze lease %s: %v", cid, err)
		}
	}
	k.runtime = stuckRuntime{Runtime: k.runtime, step: "start", cid: containerID(sb, 1), freeze: freeze, t: t}
	// Create and the rollback take seconds each under emulation; without
	// the bound the claim waits for the rig's 5 minutes.
	runscBoundCase(t, k, "start", 3*time.Minute)
}
