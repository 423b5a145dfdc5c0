package fakekernel

import (
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/ctld/ctld/internal/lease"
	"github.com/ctld/ctld/internal/node/guest/runtimetest"
	"github.com/ctld/ctld/internal/runsc"

	"github.com/ctld/ctld/internal/netpolicy"
	"github.com/ctld/ctld/internal/node/network/nettest"

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

// TestNetworkContract: the fake's netns, links, nft table and conntrack
// keep the network contract netpolicy's drivers keep in the VM
// (internal/netpolicy TestKernelNetworkContract).
func TestNetworkContract(t *testing.T) {
	nettest.Run(t, func(t *testing.T) nettest.Subject {
		k := newKernel(t)
		return nettest.Subject{
			Netns: k.Netns(), Links: k.Links(), Firewall: k.Firewall(), Flows: k.Flows(),
			Pool: netpolicy.Pool{V4: netip.MustParsePrefix("10.236.0.0/24"), V6: netip.MustParsePrefix("fd00:c71d:4e7::/64")},
			AddFlow: func(t *testing.T, slot netpolicy.Slot, proto netpolicy.Proto, dst netip.AddrPort) {
				k.AddFlow(slot, Flow{Proto: proto, Dst: dst})
			},
		}
	})
}

// TestRuntimeContract: the fake's runtime keeps the runtime contract
// *runsc.Runtime keeps with real guests in the VM (internal/runsc
// TestKernelRuntimeContract).
func TestRuntimeContract(t *testing.T) {
	runtimetest.Run(t, func(t *testing.T) runtimetest.Subject {
		k := newKernel(t)
		return runtimetest.Subject{Runtime: k.Runtime(), Bundle: func(t *testing.T, id string) string {
			ns, err := k.Netns().Create(t.Context(), id)
			if err != nil {
				t.Fatal(err)
			}
			if err := k.Leases().Create(t.Context(), lease.Spec{ID: id, CPUMillis: 500, MemoryBytes: 64 << 20, PIDs: 64}); err != nil {
				t.Fatal(err)
			}
			return writeBundle(t, runsc.BundleSpec{
				ContainerID: id, RootPath: t.TempDir(), Hostname: id, NetnsPath: ns, CgroupsPath: k.Leases().CgroupsPath(id),
				Args: []string{"sleep", "1000"},
			})
		}}
	})
}

// writeBundle writes b's bundle in a new dir and returns the dir.
func writeBundle(t *testing.T, b runsc.BundleSpec) string {
	t.Helper()
	s, err := runsc.BuildSpec(b)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "bundle")
	if err := runsc.WriteBundle(dir, s); err != nil {
		t.Fatal(err)
	}
	return dir
}
