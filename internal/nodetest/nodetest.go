// Package nodetest wires a node over the fake kernel (internal/node/
// fakekernel) for tests outside internal/node: each concern's group of
// subsystems, as cmd/ctld wires the real ones. It is not under
// internal/node, whose parts never link the node; nor is it the fake
// kernel's, which the concerns' own tests import.
package nodetest

import (
	"net/netip"

	"github.com/ctld/ctld/internal/netpolicy"
	"github.com/ctld/ctld/internal/node"
	"github.com/ctld/ctld/internal/node/blockroot"
	"github.com/ctld/ctld/internal/node/fakekernel"
	"github.com/ctld/ctld/internal/node/guest"
	"github.com/ctld/ctld/internal/node/network"
	"github.com/ctld/ctld/internal/node/overlay"
	"github.com/ctld/ctld/internal/node/pvolume"
	"github.com/ctld/ctld/internal/node/writers"
)

// Deps are every subsystem of a node over k, grouped per concern; the
// caller adds the journal, identity, epoch, answers, term and capacity.
// The DNS proxy is k's running one (k.RestartDNSProxy starts it).
func Deps(k *fakekernel.Kernel) node.Deps {
	return node.Deps{
		Guest:   guest.Deps{Leases: k.Leases(), Runtime: k.Runtime()},
		Overlay: overlay.Deps{RootFS: k.RootFS()},
		Network: network.Deps{
			Netns: k.Netns(), Links: k.Links(), Firewall: k.Firewall(), Flows: k.Flows(), DNSProxy: k.DNSProxy(),
			// A /28 of slots, and a node address no sandbox may reach.
			Pool:      netpolicy.Pool{V4: netip.MustParsePrefix("10.200.0.0/28"), V6: netip.MustParsePrefix("fd00:c71d::/120")},
			NodeAddrs: []netip.Addr{netip.MustParseAddr("192.0.2.10")},
		},
		Writers: writers.Deps{Devices: k.Blocks(), Sealer: k.Sealer()},
		Block:   blockroot.Deps{Mounts: k.BlockMounts(), Templates: k.Templates(), Volumes: k.Volumes(), Freezer: k.Freezer()},
		Volumes: pvolume.Deps{Store: k.PVolumes(), Mounts: k.VolumeMounts(), Freezer: k.VolumeMounts()},
	}
}
