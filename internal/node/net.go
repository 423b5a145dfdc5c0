package node

import (
	"context"
	"net/netip"

	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/network"
)

// The sandbox network is internal/node/network (n.net); what stays here
// is the node's side of it: its public call and the few helpers the other
// concerns still reach it by.

// UpdateNetwork replaces the network policy of the sandbox's running
// generation (a live update; network.Net.Update).
func (n *Node) UpdateNetwork(ctx context.Context, id string, want journal.NetworkPolicy) (SandboxView, error) {
	s, err := n.net.Update(ctx, id, want)
	if err != nil {
		return SandboxView{}, err
	}
	return n.view(ctx, s), nil
}

// guestNameservers are what the guest's generated resolv.conf names
// (network.Net.Nameservers).
func (n *Node) guestNameservers(rec journal.Sandbox) ([]netip.Addr, error) {
	return n.net.Nameservers(rec)
}

// kickCarriers asks the warm carrier filler to top the pool up (a slot
// may be free again; never blocks).
func (n *Node) kickCarriers() { n.net.KickCarriers() }

// lockSandbox serializes a sandbox's network updates with each other and
// with the start of its release.
func (n *Node) lockSandbox(id string) (unlock func()) { return n.locks.Lock(id) }

// identities are the node's kernel identities of a generation's objects
// (identity.go), as the netns entry journals them.
type identities struct{ n *Node }

var _ network.Identities = identities{}

func (i identities) Read(ctx context.Context, rec journal.Sandbox) (journal.Sandbox, bool) {
	return i.n.readIdentities(ctx, rec)
}
func (identities) Put(tx *journal.Tx, rec journal.Sandbox) error { return putIdentities(tx, rec) }
