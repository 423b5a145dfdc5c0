package fakekernel

import (
	"testing"

	"github.com/ctld/ctld/internal/node/guest/leasetest"
	"github.com/ctld/ctld/internal/node/overlay/rootfstest"
)

// The fake is held to the contracts the real drivers keep in the VM
// (guest/leasetest, overlay/rootfstest), each case on a kernel of its own.

// TestLeasesContract: the fake's leases keep the lease contract
// *lease.Manager keeps in the VM (internal/lease TestKernelLeasesContract).
func TestLeasesContract(t *testing.T) {
	leasetest.Run(t, func(t *testing.T) leasetest.Subject {
		k := newKernel(t)
		return leasetest.Subject{Leases: k.Leases(), Populate: func(t *testing.T, id string) {
			if err := k.Leases().Populate(id); err != nil {
				t.Fatal(err)
			}
		}}
	})
}

// TestRootFSContract: the fake's roots keep the root filesystem contract
// *rootfs.Overlay keeps in the VM (internal/rootfs
// TestKernelRootFSContract).
func TestRootFSContract(t *testing.T) {
	rootfstest.Run(t, func(t *testing.T) rootfstest.Subject {
		return rootfstest.Subject{RootFS: newKernel(t).RootFS(), Project: 77100, ProjectTo: 77110}
	})
}
