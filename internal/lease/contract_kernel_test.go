package lease_test

import (
	"os/exec"
	"testing"

	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/lease"
	"github.com/ctld/ctld/internal/node/guest/leasetest"
)

// TestKernelLeasesContract: *lease.Manager on a real cgroup2 keeps the
// lease contract the fake kernel keeps on the host (node/fakekernel
// TestLeasesContract); each case on a fresh parent, leak-checked.
func TestKernelLeasesContract(t *testing.T) {
	ktest.Require(t)
	leasetest.Run(t, func(t *testing.T) leasetest.Subject {
		m := lease.KernelManager(t) // RequireCgroup2 + CheckLeaks; removes its leases at the end
		return leasetest.Subject{Leases: m, Populate: func(t *testing.T, id string) {
			cmd := exec.Command("sleep", "1000")
			if err := lease.StartIn(t, m, id, cmd); err != nil {
				t.Fatalf("start a process in lease %s: %v", id, err)
			}
			// cgroup.kill (Kill, Remove) ends it; reap it, and end it
			// should the case not have.
			done := make(chan struct{})
			go func() { cmd.Wait(); close(done) }()
			t.Cleanup(func() {
				cmd.Process.Kill()
				<-done
			})
		}}
	})
}
