package node

import (
	"context"
	"io"
	"net/netip"
	"syscall"
	"time"

	"github.com/ctld/ctld/internal/diskquota"
	"github.com/ctld/ctld/internal/lease"
	"github.com/ctld/ctld/internal/netpolicy"
	"github.com/ctld/ctld/internal/netpolicy/dnsproxy"
	"github.com/ctld/ctld/internal/netpolicy/flows"
	"github.com/ctld/ctld/internal/netpolicy/nft"
	"github.com/ctld/ctld/internal/node/writers"
	"github.com/ctld/ctld/internal/rootfs"
	"github.com/ctld/ctld/internal/runsc"
)

// The real subsystems are what the interfaces below describe.
var (
	_ Leases  = (*lease.Manager)(nil)
	_ RootFS  = (*rootfs.Overlay)(nil)
	_ Netns   = (*netpolicy.Netns)(nil)
	_ Runtime = (*runsc.Runtime)(nil)
	_ Flows   = (*flows.Conntrack)(nil)
)

var _ DNSProxy = (*dnsproxy.Proxy)(nil)
var _ Firewall = (*nft.Firewall)(nil)

// The kernel subsystems the node drives, as the node uses them: exactly
// the methods it calls, so a fake kernel (node/fakekernel) can stand in
// for them in unit tests. main passes the real ones (*lease.Manager,
// *rootfs.Overlay, *netpolicy.Netns, *runsc.Runtime); their doc comments
// define the semantics (idempotent removal, CheckGone, List by ctld name)
// a fake must keep.

// Leases makes and removes the cgroup leases of generations.
type Leases interface {
	Create(ctx context.Context, s lease.Spec) error
	SetCPUMax(ctx context.Context, id string, millis int64) error
	Remove(ctx context.Context, id string) error
	Kill(ctx context.Context, id string) error
	Populated(ctx context.Context, id string) (bool, error)
	List(ctx context.Context) ([]string, error)
	Stats(ctx context.Context, id string) (lease.Stats, error)
	CheckGone(ctx context.Context, id string) (ok bool, detail string)
	Dir(id string) string
	CgroupsPath(id string) string
}

// RootFS makes the root filesystems of generations and their disk leases.
type RootFS interface {
	Mount(ctx context.Context, id, lower string) (root string, err error)
	Unmount(ctx context.Context, id string) error
	List(ctx context.Context) ([]string, error)
	Mounted(ctx context.Context) ([]string, error)
	Superblock(id string) (string, error)
	CheckGone(ctx context.Context, id, dev string) (ok bool, detail string)
	DiskBounded() error
	LimitDisk(ctx context.Context, id string, project uint32, bytes int64) error
	RemoveScratch(id string) error
	UnlimitDisk(ctx context.Context, project uint32) error
	CheckDiskGone(ctx context.Context, project uint32) (ok bool, detail string)
	DiskProjects(ctx context.Context, from, to uint32) ([]diskquota.Quota, error)
}

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

// Runtime runs the generations' guests (runsc containers).
type Runtime interface {
	Create(ctx context.Context, id, bundleDir string) error
	Start(ctx context.Context, id string) error
	Exec(ctx context.Context, id string, p runsc.ExecProcess, stdin io.Reader, stdout, stderr io.Writer) (int, error)
	Kill(ctx context.Context, id string, sig syscall.Signal, all bool) error
	Delete(ctx context.Context, id string) error
	Known() ([]string, error)
	CheckGone(ctx context.Context, id string) (ok bool, detail string)
	LogRoot() string
	ContainerLogDir(id string) string
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

var _ Links = (*netpolicy.Links)(nil)

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

// Block mode (rootfs.mode = block, DESIGN.md "RootFS"): the block
// subsystems are internal/node/writers' (its doc comments define them);
// these names stay for the node's wiring and rigs.
type (
	BlockDevices   = writers.Devices
	BlockMounts    = writers.Mounts
	BlockTemplates = writers.Templates
	BlockVolumes   = writers.Volumes
	BlockSealer    = writers.Sealer
	BlockFreezer   = writers.Freezer
)
