package fakekernel

import (
	"testing"

	"github.com/ctld/ctld/internal/node/guest/leasetest"
)

// TestLeasesContract: the fake's leases keep the lease contract
// *lease.Manager keeps in the VM (internal/lease TestKernelLeasesContract).
func TestLeasesContract(t *testing.T) {
	leasetest.Run(t, func(t *testing.T) leasetest.Subject {
		k, err := New(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return leasetest.Subject{Leases: k.Leases(), Populate: func(t *testing.T, id string) {
			if err := k.Leases().Populate(id); err != nil {
				t.Fatal(err)
			}
		}}
	})
}
