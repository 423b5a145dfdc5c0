// Package network is the sandbox network of the node's generations
// (docs/network-design.md): the netns, links, conntrack, nft and dns
// entries of the resource table, address slots and owners, policies and
// their live update, network status, the warm carriers and the node-wide
// parts (forwarding, the nft table, the DNS proxy's registry). The node
// orchestrates it: it builds a Net in node.New and calls it at claim
// (Check, TakeCarrier), reconcile (Ensure, RegisterDNS, RedoUpdate,
// AdoptCarriers, StartCarriers) and release (KickCarriers).
package network

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/logging"
	"github.com/ctld/ctld/internal/netpolicy"
	"github.com/ctld/ctld/internal/node/op"
	"github.com/ctld/ctld/internal/node/resource"
	"github.com/ctld/ctld/internal/proof"
)

// The sandbox network of a generation (docs/network-design.md §5): an
// address slot allocated in the claim's journal transaction, and four
// entries of the resource table, named from the slot and the generation
// (netpolicy.Owner):
//   - links: the veth pair into the netns, its addresses and routes;
//   - conntrack: nothing to make (the chain marks the flows with the
//     slot); removal flushes them, after the nft objects are gone, so no
//     new flow is marked;
//   - nft: the generation's chain, sets, counters and dispatch elements,
//     one transaction; removed before the links (teardown is the
//     reverse), so no dispatch element names a link that is gone;
//   - dns: the DNS proxy's registry entry, after nft (the proxy adds
//     answers to the generation's sets) and removed before it.
//
// Every generation gets links and nft, deny_all too (its chain drops
// everything but what the policy allows, which is nothing), so a live
// update can switch its mode without restarting the guest. A node
// without a Links or Firewall makes none of them and refuses the modes
// that need them.

// Deps are the subsystems of the sandbox network; main builds them
// (node.Deps.Network). With a Pool, every generation gets an address
// slot; with Links and Firewall also a veth and its nft objects (deny_all
// too, so a live update can open it). A node without them runs deny_all
// sandboxes with only lo and refuses the modes that need them (fail
// closed). Flows and DNSProxy are needed by open and restricted policies.
type Deps struct {
	Netns    Netns // *netpolicy.Netns
	Links    Links
	Firewall Firewall
	Flows    Flows
	DNSProxy DNSProxy
	Pool     netpolicy.Pool
	// NodeAddrs are the node's own addresses (netpolicy.Facts): never
	// reachable from a sandbox.
	NodeAddrs []netip.Addr
}

// Wiring is what the node passes the network: its subsystems, its part
// of the node's config, and what it asks of the node.
type Wiring struct {
	Deps
	Log *slog.Logger
	// Term bounds every kernel effect and operation (op.Term); Run is the
	// node's journal and epoch, and passes the crash points; Locks
	// serialize a sandbox's network updates with the start of its release
	// (the node's sandbox locks).
	Term  *op.Term
	Run   *op.Runner
	Locks *op.Locks
	// Limits bound a network policy (rules, ports per rule).
	Limits netpolicy.Limits
	// Carriers is the warm carrier pool's size; CarrierWait bounds a
	// claim's wait for one being made (0: DefaultCarrierWait).
	Carriers    int
	CarrierWait time.Duration
	// Identities reads and journals the kernel identities of a
	// generation's objects (the netns entry journals them with its done
	// record).
	Identities Identities
	// Ready is the sandbox's record if its generation is ready, else the
	// node's error (not_found, conflict).
	Ready func(id string) (journal.Sandbox, error)
}

// Identities are the kernel identities of a generation's objects
// (overlay superblock, netns, block device), read once they exist and
// journaled in its sandbox record: the node's, as they span concerns.
type Identities interface {
	// Read returns rec with the identities it does not have yet, and
	// whether it found any.
	Read(ctx context.Context, rec journal.Sandbox) (journal.Sandbox, bool)
	// Put journals rec's identities in its sandbox record (if it is
	// still rec's generation).
	Put(tx *journal.Tx, rec journal.Sandbox) error
}

// Net is the node's sandbox network.
type Net struct {
	d   Wiring
	log *slog.Logger
	// has is which parts of the network this node has, decided once by
	// New: an entry of a part it lacks is registered absent, and nothing
	// else asks its subsystem whether it is there.
	has parts

	mu sync.Mutex
	// netErr is why this term's node-wide network is not in place
	// (Ensure): claims that need it are refused.
	netErr error

	// warm is the pool of warm network carriers (carriers.go).
	warm warmPool
}

// parts are the parts of the sandbox network a node has.
type parts struct {
	netns bool // network namespaces (Netns)
	// veth: every generation gets a veth and nft objects (Links and
	// Firewall over a Pool; one without the others makes neither).
	veth  bool
	flows bool // conntrack (Flows)
	dns   bool // the DNS proxy's registry (DNSProxy, with the veth)
}

// New is the network of a node with d.
func New(d Wiring) *Net {
	veth := d.Links != nil && d.Firewall != nil && d.Pool.V4.IsValid()
	return &Net{d: d, log: logging.OrDiscard(d.Log), has: parts{
		netns: d.Netns != nil, veth: veth, flows: d.Flows != nil, dns: veth && d.DNSProxy != nil,
	}}
}

// Register adds the network's entries to b, in claim order: the netns
// before the links (which need its path), the conntrack flush after the
// nft objects that mark flows are gone, the policy before the DNS entry
// (which adds answers to its sets). Those of parts the node lacks are
// absent; a nil n declares the same specs (CrashPoints).
func Register(b *resource.Builder[*resource.Claim], n *Net) {
	if n == nil {
		n = New(Wiring{})
	}
	b.Add(netnsResource{n}, n.has.netns)
	b.Add(linksResource{n}, n.has.veth)
	b.Add(conntrackResource{n: n}, n.has.flows)
	b.Add(nftResource{n}, n.has.veth)
	b.Add(dnsResource{n: n}, n.has.dns)
}

// hasNet reports whether the node makes a veth and nft objects for every
// generation.
func (n *Net) hasNet() bool { return n.has.veth }

// hasPool reports whether generations get an address slot.
func (n *Net) hasPool() bool { return n.d.Pool.V4.IsValid() }

// allocSlot picks the lowest slot of the pool that no generation holding
// capacity (live, half done or withheld) uses, nor held (the warm
// carriers'). It runs inside a write transaction, so two claims never
// pick the same; a slot comes back only with the clean proof that ends
// its record.
func (n *Net) allocSlot(all []journal.Sandbox, held ...netpolicy.Slot) (uint32, error) {
	if !n.hasPool() {
		return 0, nil
	}
	used := held
	for _, s := range all {
		if s.Slot != 0 && (s.Holds() || s.Withheld) {
			used = append(used, netpolicy.Slot(s.Slot))
		}
	}
	slot, err := n.d.Pool.Alloc(used)
	return uint32(slot), err
}

// owner names rec's network objects; ok is false when rec has no slot.
func (n *Net) owner(rec journal.Sandbox) (o netpolicy.Owner, ok bool, err error) {
	if rec.Slot == 0 {
		return o, false, nil
	}
	b, err := n.d.Pool.Block(netpolicy.Slot(rec.Slot))
	if err != nil {
		return o, false, fmt.Errorf("address block of %s generation %d: %w", rec.ID, rec.Generation, err)
	}
	return netpolicy.Owner{ID: rec.ID, Generation: rec.Generation, Block: b}, true, nil
}

// Nameservers are what the guest's generated resolv.conf names: the
// gateways of its block, whose port 53 the node redirects to the DNS
// proxy. Every mode gets them, deny_all too: the proxy refuses its names
// at once (no resolver timeout), and a live update to another mode needs
// no change in the guest. None without a proxy or a slot: then the
// RootFS's own resolv.conf stays (nothing it names is reachable).
func (n *Net) Nameservers(rec journal.Sandbox) ([]netip.Addr, error) {
	if !n.has.dns {
		return nil, nil
	}
	o, ok, err := n.owner(rec)
	if err != nil || !ok {
		return nil, fmt.Errorf("nameservers of the guest: %w", orNoSlot(err, rec))
	}
	ns := []netip.Addr{o.Block.Gateway4}
	if o.Block.Gateway6.IsValid() {
		ns = append(ns, o.Block.Gateway6)
	}
	return ns, nil
}

// policyOf is the policy rec's generation should enforce: a live update
// in flight, else the one in force, else the claim's.
func policyOf(rec journal.Sandbox) journal.NetworkPolicy {
	switch {
	case rec.NetworkUpdate != nil:
		return rec.NetworkUpdate.Policy
	case rec.Network != nil:
		return *rec.Network
	case rec.Request != nil:
		return rec.Request.Network
	}
	return journal.NetworkPolicy{}
}

func specOf(p journal.NetworkPolicy) netpolicy.Spec {
	s := netpolicy.Spec{Mode: string(p.Mode)}
	for _, r := range p.Rules {
		s.Rules = append(s.Rules, netpolicy.RuleSpec{CIDR: r.CIDR, Domain: r.Domain, Protocol: r.Protocol, Ports: r.Ports})
	}
	return s
}

// Parse validates a policy with the node's limits (Deps.Limits).
func (n *Net) Parse(p journal.NetworkPolicy) (netpolicy.Policy, error) {
	return n.d.Limits.Parse("network", specOf(p))
}

// effective resolves p for o on this node.
func (n *Net) effective(o netpolicy.Owner, p netpolicy.Policy) netpolicy.Effective {
	return netpolicy.Resolve(p, netpolicy.Facts{Pool: n.d.Pool, Block: o.Block, NodeAddrs: n.d.NodeAddrs})
}

// Check refuses, before anything is journaled, a policy this node
// cannot enforce: every mode but deny_all needs the veth and the
// firewall, and the conntrack flows (live updates cut them); a policy
// that resolves names needs the DNS proxy.
func (n *Net) Check(p netpolicy.Policy) error {
	if n.hasNet() {
		// Every generation gets its chain: none without the table.
		if err := n.netReady(); err != nil {
			return err
		}
	}
	if p.Mode == netpolicy.ModeDenyAll {
		return nil
	}
	var missing []string
	if !n.hasNet() {
		missing = append(missing, "links and firewall")
	}
	if !n.has.flows {
		missing = append(missing, "conntrack")
	}
	domains := p.Mode == netpolicy.ModeOpen
	for _, r := range p.Rules {
		domains = domains || r.IsDomain()
	}
	if domains && !n.has.dns {
		missing = append(missing, "DNS proxy")
	}
	if len(missing) > 0 {
		return errdefs.Errorf(errdefs.CodeUnavailable, "network mode %q is not available on this node: it has no %v (only %q is)", p.Mode, missing, netpolicy.ModeDenyAll)
	}
	return n.netReady()
}

// netReady is nil once this term's firewall table is in place (Ensure).
func (n *Net) netReady() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.netErr != nil {
		return errdefs.Errorf(errdefs.CodeUnavailable, "sandbox network not ready: %v", n.netErr)
	}
	return nil
}

// Ensure makes the node-wide parts of the sandbox network once per
// term, before anything is served: the forwarding sysctls and the nft
// table with its base chains (never flushed: the generations' objects in
// it keep enforcing through a failover). A failure keeps the node from
// claiming any generation that would need them.
func (n *Net) Ensure(ctx context.Context) error {
	var err error
	if n.hasNet() {
		if e := n.d.Links.EnableForwarding(ctx, n.d.Pool.IPv6()); e != nil {
			err = fmt.Errorf("enable forwarding: %w", e)
		}
		if err == nil {
			if e := n.d.Firewall.Ensure(ctx); e != nil {
				err = fmt.Errorf("ensure the nft table: %w", e)
			}
		}
	}
	n.mu.Lock()
	n.netErr = err
	n.mu.Unlock()
	return err
}

// RegisterDNS rebuilds the DNS proxy's registry from the journal: every
// ready generation with a slot answers again at once (the registry is
// memory; set elements already in the kernel keep working meanwhile).
func (n *Net) RegisterDNS(ss []journal.Sandbox) {
	if !n.has.dns {
		return
	}
	for _, s := range ss {
		if s.State != journal.StateReady || s.Withheld {
			continue
		}
		o, ok, err := n.owner(s)
		if err != nil || !ok {
			continue
		}
		pol, err := n.Parse(policyOf(s))
		if err != nil {
			n.log.Error("journaled network policy no longer parses; DNS proxy entry not rebuilt", "sandbox", s.ID, "generation", s.Generation, "err", err)
			continue
		}
		n.d.DNSProxy.Register(o, n.effective(o, pol))
	}
}

// noSlot is the check of an entry a generation without an address slot
// has no object of.
func noSlot(name string) proof.Check {
	return resource.Check(name, true, "no address slot: no network object was made")
}

// ownedGone is the check of an entry made for the generation's owner
// (slot and address block): a generation without a slot made nothing; an
// unreadable block fails.
func (n *Net) ownedGone(name string, rec journal.Sandbox, gone func(netpolicy.Owner) (bool, string)) proof.Check {
	o, ok, err := n.owner(rec)
	switch {
	case err != nil:
		return resource.Check(name, false, err.Error())
	case !ok:
		return noSlot(name)
	}
	ok, d := gone(o)
	return resource.Check(name, ok, d)
}

// linksResource is the veth pair: host end netpolicy.LinkName(slot)
// with the gateway addresses, its peer eth0 in the netns.
type linksResource struct{ n *Net }

func (r linksResource) Spec() resource.Spec {
	return resource.Spec{Kind: journal.KindLinks, Phase: resource.PhaseNetwork, Check: "veth_gone_address_free", Sweeps: true, Optional: true}
}
func (r linksResource) Make(ctx context.Context, c *resource.Claim) error {
	if TookCarrier(c.Rec) {
		return nil // a warm carrier's veth is made already (carriers.go)
	}
	o, ok, err := r.n.owner(c.Rec)
	if err != nil || !ok {
		return fmt.Errorf("make veth: %w", orNoSlot(err, c.Rec))
	}
	if err := r.n.d.Links.Make(ctx, o, c.NSPath); err != nil {
		return fmt.Errorf("make veth: %w", err)
	}
	return nil
}
func (r linksResource) Remove(ctx context.Context, rec journal.Sandbox) error {
	if rec.Slot == 0 {
		return nil
	}
	return r.n.d.Links.Remove(ctx, netpolicy.LinkName(netpolicy.Slot(rec.Slot)))
}
func (r linksResource) Gone(ctx context.Context, rec journal.Sandbox) proof.Check {
	return r.n.ownedGone("veth_gone_address_free", rec, func(o netpolicy.Owner) (bool, string) {
		return r.n.d.Links.CheckGone(ctx, o)
	})
}
func (r linksResource) List(ctx context.Context) ([]string, error) {
	return r.n.d.Links.List(ctx)
}
func (linksResource) Name(rec journal.Sandbox) string {
	if rec.Slot == 0 {
		return ""
	}
	return netpolicy.LinkName(netpolicy.Slot(rec.Slot))
}
func (r linksResource) RemoveOrphan(ctx context.Context, name string) error {
	if _, ok := netpolicy.ParseLinkName(name); !ok {
		return fmt.Errorf("remove link %q: not a sandbox link name", name)
	}
	return r.n.d.Links.Remove(ctx, name)
}

// missing: a ready generation whose veth is gone has lost its network.
func (r linksResource) Survey(ctx context.Context) (resource.Missing, error) {
	links, err := r.n.d.Links.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list sandbox links: %w", err)
	}
	return resource.MissingUnless(resource.SetOf(links), r.Name, "veth"), nil
}

// conntrackResource is the generation's flows, marked with its slot by
// its chain.
type conntrackResource struct {
	n *Net
	unswept
}

func (conntrackResource) Spec() resource.Spec {
	return resource.Spec{Kind: journal.KindConntrack, Phase: resource.PhaseNetwork, Check: "conntrack_gone", Sweeps: false, Optional: true}
}
func (conntrackResource) Make(context.Context, *resource.Claim) error { return nil }
func (r conntrackResource) Remove(ctx context.Context, rec journal.Sandbox) error {
	if rec.Slot == 0 {
		return nil
	}
	return r.n.d.Flows.Flush(ctx, netpolicy.Slot(rec.Slot))
}
func (r conntrackResource) Gone(ctx context.Context, rec journal.Sandbox) proof.Check {
	const name = "conntrack_gone"
	if rec.Slot == 0 {
		return noSlot(name)
	}
	ok, d := r.n.d.Flows.CheckGone(ctx, netpolicy.Slot(rec.Slot))
	return resource.Check(name, ok, d)
}

// nftResource is the generation's objects in ctld's nft table: chain,
// sets, counters, its dispatch and DNS elements.
type nftResource struct{ n *Net }

func (r nftResource) Spec() resource.Spec {
	return resource.Spec{Kind: journal.KindNft, Phase: resource.PhaseNetwork, Check: "nft_gone", Sweeps: true, Optional: true}
}
func (r nftResource) Make(ctx context.Context, c *resource.Claim) error {
	o, ok, err := r.n.owner(c.Rec)
	if err != nil || !ok {
		return fmt.Errorf("apply network policy: %w", orNoSlot(err, c.Rec))
	}
	pol, err := r.n.Parse(policyOf(c.Rec))
	if err != nil {
		return err
	}
	if err := r.n.d.Firewall.Apply(ctx, o, r.n.effective(o, pol)); err != nil {
		return fmt.Errorf("apply network policy: %w", err)
	}
	return nil
}
func (r nftResource) Remove(ctx context.Context, rec journal.Sandbox) error {
	o, ok, err := r.n.owner(rec)
	if err != nil || !ok {
		return err // no slot: nothing was made (make needs one)
	}
	return r.n.d.Firewall.Remove(ctx, o)
}
func (r nftResource) Gone(ctx context.Context, rec journal.Sandbox) proof.Check {
	return r.n.ownedGone("nft_gone", rec, func(o netpolicy.Owner) (bool, string) {
		return r.n.d.Firewall.CheckGone(ctx, o)
	})
}
func (r nftResource) List(ctx context.Context) ([]string, error) {
	return r.n.d.Firewall.List(ctx)
}
func (nftResource) Name(rec journal.Sandbox) string {
	if rec.Slot == 0 {
		return ""
	}
	return netpolicy.ChainName(rec.ID, rec.Generation)
}
func (r nftResource) RemoveOrphan(ctx context.Context, chain string) error {
	if _, _, ok := netpolicy.ParseChainName(chain); !ok {
		return fmt.Errorf("remove nft objects of %q: not a generation's chain name", chain)
	}
	return r.n.d.Firewall.RemoveOrphan(ctx, chain)
}

// missing: without its chain a ready generation's traffic is dropped
// (the base chain's catch-all): its network is lost.
func (r nftResource) Survey(ctx context.Context) (resource.Missing, error) {
	chains, err := r.n.d.Firewall.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list nft objects: %w", err)
	}
	return resource.MissingUnless(resource.SetOf(chains), r.Name, "nft chain"), nil
}

// dnsResource is the generation's entry in the DNS proxy's registry.
type dnsResource struct {
	n *Net
	unswept
}

func (dnsResource) Spec() resource.Spec {
	return resource.Spec{Kind: journal.KindDNS, Phase: resource.PhaseNetwork, Check: "dns_state_gone", Sweeps: false, Optional: true}
}
func (r dnsResource) Make(_ context.Context, c *resource.Claim) error {
	o, ok, err := r.n.owner(c.Rec)
	if err != nil || !ok {
		return fmt.Errorf("register with the DNS proxy: %w", orNoSlot(err, c.Rec))
	}
	pol, err := r.n.Parse(policyOf(c.Rec))
	if err != nil {
		return err
	}
	r.n.d.DNSProxy.Register(o, r.n.effective(o, pol))
	return nil
}
func (r dnsResource) Remove(_ context.Context, rec journal.Sandbox) error {
	if rec.Slot != 0 {
		r.n.d.DNSProxy.Unregister(netpolicy.Slot(rec.Slot))
	}
	return nil
}
func (r dnsResource) Gone(_ context.Context, rec journal.Sandbox) proof.Check {
	const name = "dns_state_gone"
	switch {
	case rec.Slot == 0:
		return noSlot(name)
	case r.n.d.DNSProxy.Registered(netpolicy.Slot(rec.Slot)):
		return resource.Check(name, false, fmt.Sprintf("slot %d is registered with the DNS proxy", rec.Slot))
	}
	return resource.Check(name, true, fmt.Sprintf("slot %d is not registered with the DNS proxy", rec.Slot))
}

func orNoSlot(err error, rec journal.Sandbox) error {
	if err != nil {
		return err
	}
	return fmt.Errorf("generation %d of %s has no address slot", rec.Generation, rec.ID)
}

// unswept is the sweep's part of an entry whose objects the kernel does
// not list under a name of ctld's: conntrack flows (a flow of a slot no
// generation holds is flushed by the next teardown of that slot, and
// conntrack times it out anyway) and the DNS proxy's registry (this
// process's memory, rebuilt by each term: nothing of another term is in
// it). Their effect records are still finished by reconcile.
type unswept struct{}

func (unswept) List(context.Context) ([]string, error)     { return nil, nil }
func (unswept) Name(journal.Sandbox) string                { return "" }
func (unswept) RemoveOrphan(context.Context, string) error { return nil }

// netnsResource is the generation's network namespace (a warm carrier's
// if it took one).
type netnsResource struct{ n *Net }

func (netnsResource) Spec() resource.Spec {
	return resource.Spec{Kind: journal.KindNetns, Phase: resource.PhaseNetwork, Check: "netns_gone", Sweeps: true}
}
func (r netnsResource) Make(ctx context.Context, c *resource.Claim) (err error) {
	if TookCarrier(c.Rec) {
		// A warm carrier's netns, made before the claim (carriers.go).
		c.NSPath = r.n.d.Netns.Path(c.Rec.Netns)
	} else if c.NSPath, err = r.n.d.Netns.Create(ctx, c.Rec.ContainerID); err != nil {
		return fmt.Errorf("create netns: %w", err)
	}
	// The overlay and the netns both exist now: journal their kernel
	// identities (with this entry's done record), so the proof checks
	// these objects and not only names.
	var changed bool
	if c.Rec, changed = r.n.d.Identities.Read(ctx, c.Rec); changed {
		rec := c.Rec
		c.WithDone(func(tx *journal.Tx) error { return r.n.d.Identities.Put(tx, rec) })
	}
	return nil
}
func (r netnsResource) Remove(ctx context.Context, rec journal.Sandbox) error {
	return r.n.d.Netns.Delete(ctx, netnsName(rec))
}
func (r netnsResource) Gone(ctx context.Context, rec journal.Sandbox) proof.Check {
	ok, d := r.n.d.Netns.CheckGone(ctx, netnsName(rec), netnsID(rec))
	return resource.Check("netns_gone", ok, d)
}
func (r netnsResource) List(ctx context.Context) ([]string, error) {
	return r.n.d.Netns.List(ctx)
}
func (netnsResource) Name(rec journal.Sandbox) string { return netnsName(rec) }
func (r netnsResource) RemoveOrphan(ctx context.Context, name string) error {
	return r.n.d.Netns.Delete(ctx, name)
}
func (r netnsResource) Survey(ctx context.Context) (resource.Missing, error) {
	netns, err := r.n.d.Netns.Mounted(ctx)
	if err != nil {
		return nil, fmt.Errorf("list netns mounts: %w", err)
	}
	return resource.MissingUnless(resource.SetOf(netns), netnsName, "netns"), nil
}

// IdentifyNetns returns rec with its netns's kernel identity if it does
// not have it yet, and whether it found it (node's identities).
func (n *Net) IdentifyNetns(ctx context.Context, rec journal.Sandbox) (journal.Sandbox, bool) {
	if rec.NetnsIno != 0 {
		return rec, false
	}
	id, err := n.d.Netns.Identify(ctx, netnsName(rec))
	if err != nil {
		return rec, false
	}
	rec.NetnsDev, rec.NetnsIno, rec.NetnsCookie = id.Dev, id.Ino, id.Cookie
	return rec, true
}

func netnsID(rec journal.Sandbox) netpolicy.NSID {
	return netpolicy.NSID{Dev: rec.NetnsDev, Ino: rec.NetnsIno, Cookie: rec.NetnsCookie}
}
