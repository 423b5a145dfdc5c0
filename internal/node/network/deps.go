package network

import (
	"context"
	"net/netip"
	"time"

	"github.com/ctld/ctld/internal/netpolicy"
	"github.com/ctld/ctld/internal/netpolicy/dnsproxy"
	"github.com/ctld/ctld/internal/netpolicy/flows"
	"github.com/ctld/ctld/internal/netpolicy/nft"
)

// The real subsystems are what the interfaces below describe; a fake
// kernel (node/fakekernel) stands in for them in unit tests. Their doc
// comments define the semantics (idempotent removal, CheckGone, List by
// ctld name) a fake must keep.
var (
	_ Netns    = (*netpolicy.Netns)(nil)
	_ Links    = (*netpolicy.Links)(nil)
	_ Firewall = (*nft.Firewall)(nil)
	_ Flows    = (*flows.Conntrack)(nil)
	_ DNSProxy = (*dnsproxy.Proxy)(nil)
)

// Netns makes and removes the network namespaces of generations.
type Netns interface {
	Create(ctx context.Context, name string) (path string, err error)
	Delete(ctx context.Context, name string) error
	List(ctx context.Context) ([]string, error)
	Mounted(ctx context.Context) ([]string, error)
	Path(name string) string
	Identify(ctx context.Context, name string) (netpolicy.NSID, error)
	CheckGone(ctx context.Context, name string, id netpolicy.NSID) (ok bool, detail string)
}

// The sandbox network (issue 8, docs/network-design.md). Each interface is
// one resource kind of a generation; the node names objects from a
// netpolicy.Owner. Every Remove is idempotent (absent is success) and every
// CheckGone is the cleanup proof's check of the physical object.

// Links makes the veth pair that joins a generation's netns to the node.
type Links interface {
	// Make creates the pair: the host end o.Link() (alias o.Alias(),
	// the block's gateway addresses, up) and its peer "eth0" inside the
	// netns at nsPath (the block's sandbox addresses, default routes via
	// the gateways, up).
	Make(ctx context.Context, o netpolicy.Owner, nsPath string) error
	// Remove deletes the host end by name (the peer goes with it).
	Remove(ctx context.Context, link string) error
	// CheckGone: no link o.Link(), none with o.Alias(), and no address of
	// o.Block held by any link of the root netns.
	CheckGone(ctx context.Context, o netpolicy.Owner) (ok bool, detail string)
	// List names the host links of ctld (netpolicy.LinkPrefix) that exist.
	List(ctx context.Context) ([]string, error)
	// EnableForwarding turns on the node-wide forwarding sysctls (IPv4,
	// and IPv6 when v6), idempotently: once per primary term, before the
	// first sandbox gets a link.
	EnableForwarding(ctx context.Context, v6 bool) error
}

// Firewall is ctld's nft table (inet ctld) and the generations' objects
// in it: chain, sets, counters, dispatch and DNS map elements.
type Firewall interface {
	// Ensure makes the table and its base chains and maps if missing,
	// without touching any generation's objects (idempotent; a new
	// primary calls it before it serves).
	Ensure(ctx context.Context) error
	// Apply makes or replaces o's objects so they enforce eff, in one nft
	// transaction: after it returns the old policy or the new one holds,
	// never a mix.
	Apply(ctx context.Context, o netpolicy.Owner, eff netpolicy.Effective) error
	// Remove deletes every object of o (dispatch and DNS elements first).
	Remove(ctx context.Context, o netpolicy.Owner) error
	CheckGone(ctx context.Context, o netpolicy.Owner) (ok bool, detail string)
	// List names the generations (netpolicy.ChainName) that own any object
	// in the table, including a dispatch element whose chain is missing.
	List(ctx context.Context) ([]string, error)
	// RemoveOrphan deletes every object of the generation chain names.
	RemoveOrphan(ctx context.Context, chain string) error
	Counters(ctx context.Context, o netpolicy.Owner) (netpolicy.Counters, error)
	// AllowResolved adds addrs to o's domain set number set (an index of
	// Effective.Domains) with the element timeout ttl; the DNS proxy
	// answers only after it returns.
	AllowResolved(ctx context.Context, o netpolicy.Owner, set int, addrs []netip.Addr, ttl time.Duration) error
}

// Flows is the conntrack state of generations, found by the ct mark their
// chain sets (the slot).
type Flows interface {
	// Flush deletes every flow of slot.
	Flush(ctx context.Context, slot netpolicy.Slot) error
	CheckGone(ctx context.Context, slot netpolicy.Slot) (ok bool, detail string)
	// Cut deletes the flows of slot whose destination eff no longer
	// allows (a live update) and says how many it deleted.
	Cut(ctx context.Context, slot netpolicy.Slot, eff netpolicy.Effective) (int, error)
}

// DNSProxy is the registry of the DNS proxy: which generation sends from
// which slot, and what its policy lets it resolve. It is memory, rebuilt
// from the journal by a new primary.
type DNSProxy interface {
	// Register makes (or replaces) o's entry.
	Register(o netpolicy.Owner, eff netpolicy.Effective)
	Unregister(slot netpolicy.Slot)
	Registered(slot netpolicy.Slot) bool
}
