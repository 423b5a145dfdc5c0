package fakekernel

import (
	"testing"

	"github.com/ctld/ctld/internal/node/overlay/rootfstest"
)

// TestRootFSContract: the fake's roots keep the root filesystem contract
// *rootfs.Overlay keeps in the VM (internal/rootfs
// TestKernelRootFSContract).
func TestRootFSContract(t *testing.T) {
	rootfstest.Run(t, func(t *testing.T) rootfstest.Subject {
		k, err := New(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return rootfstest.Subject{RootFS: k.RootFS(), Project: 77100, ProjectTo: 77110}
	})
}
