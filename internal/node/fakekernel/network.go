package fakekernel

import (
	"context"
	"fmt"
	"github.com/ctld/ctld/internal/journal"
	"io/fs"
	"maps"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/names"
	"github.com/ctld/ctld/internal/netpolicy"
	"github.com/ctld/ctld/internal/netpolicy/flows"
)

// The sandbox network's subsystems (network.Links, network.Firewall, network.Flows,
// network.DNSProxy): veth pairs, ctld's nft table with each generation's
// chain and dispatch element, conntrack flows by slot, and the DNS
// proxy's registry. Objects of a generation are named for Refuse and
// FailMake by the generation's name ("sb-g1": the link's alias, the
// chain's owner); conntrack flows by the slot's number.

type link struct {
	name, alias string
	ns          uint64 // the namespace its peer eth0 is in
	block       netpolicy.Block
}

type fwChain struct {
	owner    netpolicy.Owner
	eff      netpolicy.Effective
	counters netpolicy.Counters
	resolved map[int]map[netip.Addr]time.Duration // domain set → element → timeout
}

// Flow is a conntrack entry the fake keeps for a slot: its protocol and
// original destination.
type Flow struct {
	Proto netpolicy.Proto
	Dst   netip.AddrPort
}

func (f Flow) String() string { return string(f.Proto) + " " + f.Dst.String() }

type dnsEntry struct {
	owner netpolicy.Owner
	eff   netpolicy.Effective
}

// Links is the fake's network.Links.
func (k *Kernel) Links() *Links { return (*Links)(k) }

// Firewall is the fake's network.Firewall.
func (k *Kernel) Firewall() *Firewall { return (*Firewall)(k) }

// Flows is the fake's network.Flows.
func (k *Kernel) Flows() *Flows { return (*Flows)(k) }

// DNSProxy is the fake's network.DNSProxy: its registry is the memory of
// one process (see RestartDNSProxy).
func (k *Kernel) DNSProxy() *DNSProxy { return (*DNSProxy)(k) }

// RestartDNSProxy forgets the DNS proxy's registry, as a new primary's
// process starts with an empty one.
func (k *Kernel) RestartDNSProxy() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.dns = map[netpolicy.Slot]dnsEntry{}
}

// EnableForwarding turns the node's forwarding on (idempotent).
func (l *Links) EnableForwarding(_ context.Context, v6 bool) error {
	k := l.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.forwarding {
		k.forwarding = true
		k.call("sysctl forwarding on")
	}
	return nil
}

// Forwarding reports whether EnableForwarding ran.
func (k *Kernel) Forwarding() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.forwarding
}

// AddFlow adds a flow of slot, as the guest opening a connection would.
func (k *Kernel) AddFlow(slot netpolicy.Slot, f Flow) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.flows[slot] = append(k.flows[slot], f)
}

// FlowsOf lists slot's flows.
func (k *Kernel) FlowsOf(slot netpolicy.Slot) []Flow {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.flows[slot])
}

// SetCounters sets the counters of the generation's chain.
func (k *Kernel) SetCounters(chain string, c netpolicy.Counters) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if ch, ok := k.chains[chain]; ok {
		ch.counters = c
	}
}

// Effective returns what the chain of the generation enforces.
func (k *Kernel) Effective(chain string) (netpolicy.Effective, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	ch, ok := k.chains[chain]
	if !ok {
		return netpolicy.Effective{}, false
	}
	return ch.eff, true
}

// Registered returns the policy the DNS proxy holds for slot.
func (k *Kernel) Registered(slot netpolicy.Slot) (netpolicy.Effective, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	e, ok := k.dns[slot]
	return e.eff, ok
}

// TableEnsured reports whether ctld's nft table exists.
func (k *Kernel) TableEnsured() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.table
}

// DropTable deletes ctld's nft table with everything in it, as an
// operator's `nft flush ruleset` would.
func (k *Kernel) DropTable() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.table = false
	k.chains, k.fwd = map[string]*fwChain{}, map[string]string{}
}

// renderNetLocked adds the network's lines to String. The table itself
// is node-wide (made once per term), not a generation's: not listed.
func (k *Kernel) renderNetLocked(add func(string, ...any)) {
	for _, l := range k.links {
		add("link %s alias %s peer eth0 in net:[%d] gateway %s sandbox %s", l.name, l.alias, l.ns, l.block.Gateway4, l.block.Addr4)
	}
	for name, ch := range k.chains {
		add("nft chain %s mode %s allow4 %d allow6 %d domains %d", name, ch.eff.Mode, len(ch.eff.Allow4), len(ch.eff.Allow6), len(ch.eff.Domains))
		for set, els := range ch.resolved {
			for a, ttl := range els {
				add("nft chain %s domain set %d element %s timeout %v", name, set, a, ttl)
			}
		}
	}
	for l, chain := range k.fwd {
		add("nft dispatch %s goto %s", l, chain)
	}
	for slot, fs := range k.flows {
		for _, f := range fs {
			add("conntrack mark %d %s", slot, f)
		}
	}
	for slot, e := range k.dns {
		add("dns slot %d %s mode %s", slot, e.owner.Alias(), e.eff.Mode)
	}
}

// gcLinksLocked drops the pairs whose netns died: a namespace takes its
// veth ends with it, and the host end goes with its peer. A refused link
// stays (Refuse).
func (k *Kernel) gcLinksLocked() {
	for name, l := range k.links {
		if _, ok := k.namespaces[l.ns]; !ok && k.refused(journal.KindLinks, l.alias) == nil {
			delete(k.links, name)
		}
	}
}

// Links fakes the veth pairs (netpolicy's Links).
type Links Kernel

func (l *Links) k() *Kernel { return (*Kernel)(l) }

func validOwner(o netpolicy.Owner) error {
	if err := names.CheckGeneration(o.ID, o.Generation); err != nil {
		return err
	}
	if o.Block.Slot == 0 || !o.Block.Addr4.IsValid() {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "owner %s has no address block", o.Alias())
	}
	return nil
}

// Make creates o's pair, the peer in the netns at nsPath; the same pair
// again is success, o's pair into another netns is made again there, a
// link of that name with another owner's alias a conflict.
func (l *Links) Make(ctx context.Context, o netpolicy.Owner, nsPath string) error {
	if err := validOwner(o); err != nil {
		return err
	}
	if !filepath.IsAbs(nsPath) {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "links of %s: netns path %q is not absolute", o.Alias(), nsPath)
	}
	k := l.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.makeFails(journal.KindLinks, o.Alias()); err != nil {
		return fmt.Errorf("make veth %s: %w", o.Link(), err)
	}
	var ns uint64
	for name, ino := range k.netns {
		if k.Netns().Path(name) == nsPath {
			ns = ino
		}
	}
	if ns == 0 {
		return fmt.Errorf("make veth %s: open netns %s: %w", o.Link(), nsPath, fs.ErrNotExist)
	}
	if have, ok := k.links[o.Link()]; ok {
		if have.alias != "" && have.alias != o.Alias() {
			return errdefs.Errorf(errdefs.CodeConflict, "make veth %s: file exists (alias %s)", o.Link(), have.alias)
		}
		if have.ns == ns && have.block == o.Block {
			return nil
		}
		// Not this netns's pair (an earlier try's): deleted, made again.
		delete(k.links, o.Link())
	}
	k.links[o.Link()] = &link{name: o.Link(), alias: o.Alias(), ns: ns, block: o.Block}
	k.call("link make %s %s", o.Link(), o.Alias())
	return nil
}

// Remove deletes the host end (and its peer); absent is success.
func (l *Links) Remove(ctx context.Context, name string) error {
	if _, ok := netpolicy.ParseLinkName(name); !ok {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "remove link %q: not a sandbox link", name)
	}
	k := l.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	have, ok := k.links[name]
	if !ok {
		return nil
	}
	if err := k.refused(journal.KindLinks, have.alias); err != nil {
		return fmt.Errorf("delete link %s: %w", name, err)
	}
	delete(k.links, name)
	k.call("link remove %s", name)
	return nil
}

// CheckGone: no link o.Link(), none with o's alias, none holding o's
// gateway addresses.
func (l *Links) CheckGone(ctx context.Context, o netpolicy.Owner) (bool, string) {
	k := l.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	var left []string
	for _, have := range k.links {
		switch {
		case have.name == o.Link():
			left = append(left, "link "+have.name+" exists (alias "+have.alias+")")
		case have.alias == o.Alias():
			left = append(left, "link "+have.name+" has alias "+have.alias)
		case have.block.Gateway4 == o.Block.Gateway4 || o.Block.Gateway6.IsValid() && have.block.Gateway6 == o.Block.Gateway6:
			left = append(left, "link "+have.name+" holds gateway "+o.Block.Gateway4.String())
		}
	}
	if len(left) > 0 {
		slices.Sort(left)
		return false, strings.Join(left, "; ")
	}
	return true, fmt.Sprintf("no link %s, none with alias %s, address block %s free", o.Link(), o.Alias(), o.Block.Net4)
}

// List names the host ends, sorted.
func (l *Links) List(ctx context.Context) ([]string, error) {
	k := l.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Sorted(maps.Keys(k.links)), nil
}

// Firewall fakes ctld's nft table.
type Firewall Kernel

func (f *Firewall) k() *Kernel { return (*Kernel)(f) }

// TableName names the table for FailMake(journal.KindNft, TableName): Ensure
// fails.
const TableName = "inet ctld"

// Ensure makes the table if it is missing.
func (f *Firewall) Ensure(ctx context.Context) error {
	k := f.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.makeFails(journal.KindNft, TableName); err != nil {
		return fmt.Errorf("nft: add table %s: %w", TableName, err)
	}
	if !k.table {
		k.table = true
		k.call("nft ensure")
	}
	return nil
}

func (k *Kernel) tableLocked() error {
	if !k.table {
		return fmt.Errorf("nft: table inet ctld: %w", fs.ErrNotExist)
	}
	return nil
}

// Apply makes or replaces o's chain and its dispatch element, at once.
func (f *Firewall) Apply(ctx context.Context, o netpolicy.Owner, eff netpolicy.Effective) error {
	if err := validOwner(o); err != nil {
		return err
	}
	k := f.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.tableLocked(); err != nil {
		return err
	}
	if err := k.makeFails(journal.KindNft, o.Alias()); err != nil {
		return fmt.Errorf("nft apply %s: %w", o.Chain(), err)
	}
	if c, ok := k.fwd[o.Link()]; ok && c != o.Chain() {
		return errdefs.Errorf(errdefs.CodeConflict, "apply nft objects of %s: link %s dispatches to %s", o.Chain(), o.Link(), c)
	}
	ch, ok := k.chains[o.Chain()]
	if !ok {
		ch = &fwChain{}
		k.chains[o.Chain()] = ch
	}
	// Sets whose profile (names, protocol, ports: the real firewall's
	// rule comment) changed are emptied: their elements go.
	for set := range ch.resolved {
		if set >= len(eff.Domains) || set >= len(ch.eff.Domains) || !sameDomainSet(ch.eff.Domains[set], eff.Domains[set]) {
			delete(ch.resolved, set)
		}
	}
	ch.owner, ch.eff = o, eff
	k.fwd[o.Link()] = o.Chain()
	k.call("nft apply %s %s", o.Chain(), eff.Mode)
	return nil
}

// Remove deletes o's dispatch element and chain; absent is success.
func (f *Firewall) Remove(ctx context.Context, o netpolicy.Owner) error {
	k := f.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.refused(journal.KindNft, o.Alias()); err != nil {
		return fmt.Errorf("nft remove %s: %w", o.Chain(), err)
	}
	changed := false
	if k.fwd[o.Link()] == o.Chain() {
		delete(k.fwd, o.Link())
		changed = true
	}
	if _, ok := k.chains[o.Chain()]; ok {
		delete(k.chains, o.Chain())
		changed = true
	}
	if changed {
		k.call("nft remove %s", o.Chain())
	}
	return nil
}

// CheckGone: no chain of o and no dispatch element for o's link.
func (f *Firewall) CheckGone(ctx context.Context, o netpolicy.Owner) (bool, string) {
	k := f.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	var left []string
	if _, ok := k.chains[o.Chain()]; ok {
		left = append(left, "chain "+o.Chain()+" exists")
	}
	if c, ok := k.fwd[o.Link()]; ok {
		left = append(left, "fwd element "+o.Link()+" : goto "+c)
	}
	if len(left) > 0 {
		return false, strings.Join(left, "; ")
	}
	return true, fmt.Sprintf("no chain, set or counter %s, no fwd or dns element for %s", o.Chain(), o.Link())
}

// List names the generations with a chain or a dispatch element.
func (f *Firewall) List(ctx context.Context) ([]string, error) {
	k := f.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	seen := map[string]bool{}
	for name := range k.chains {
		seen[name] = true
	}
	for _, c := range k.fwd {
		seen[c] = true
	}
	out := make([]string, 0, len(seen))
	for name := range seen {
		out = append(out, name)
	}
	slices.Sort(out)
	return out, nil
}

// RemoveOrphan deletes the chain and every dispatch element to it.
func (f *Firewall) RemoveOrphan(ctx context.Context, chain string) error {
	id, gen, ok := netpolicy.ParseChainName(chain)
	if !ok || netpolicy.ChainName(id, gen) != chain {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "nft: %q is not a generation's chain", chain)
	}
	k := f.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.refused(journal.KindNft, names.Generation(id, gen)); err != nil {
		return fmt.Errorf("nft remove %s: %w", chain, err)
	}
	delete(k.chains, chain)
	for l, c := range k.fwd {
		if c == chain {
			delete(k.fwd, l)
		}
	}
	k.call("nft remove orphan %s", chain)
	return nil
}

// Counters reads o's counters.
func (f *Firewall) Counters(ctx context.Context, o netpolicy.Owner) (netpolicy.Counters, error) {
	k := f.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	ch, ok := k.chains[o.Chain()]
	if !ok {
		return netpolicy.Counters{}, errdefs.Errorf(errdefs.CodeNotFound, "read nft counter %s.tx: %w", o.Chain(), fs.ErrNotExist)
	}
	return ch.counters, nil
}

// AllowResolved adds addrs to o's domain set with timeout ttl; IPv6
// addresses of an owner without IPv6 are skipped, as the real firewall's.
func (f *Firewall) AllowResolved(ctx context.Context, o netpolicy.Owner, set int, addrs []netip.Addr, ttl time.Duration) error {
	if set < 0 || ttl < time.Millisecond {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "allow resolved addresses for %s: domain set %d, ttl %v", o.Chain(), set, ttl)
	}
	addrs = slices.DeleteFunc(slices.Clone(addrs), func(a netip.Addr) bool { return a.Unmap().Is6() && !o.Block.Addr6.IsValid() })
	if len(addrs) == 0 {
		return nil
	}
	k := f.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	ch, ok := k.chains[o.Chain()]
	if !ok || set < 0 || set >= len(ch.eff.Domains) {
		return fmt.Errorf("nft: set %s.d%d: %w", o.Chain(), set, fs.ErrNotExist)
	}
	if ch.resolved == nil {
		ch.resolved = map[int]map[netip.Addr]time.Duration{}
	}
	if ch.resolved[set] == nil {
		ch.resolved[set] = map[netip.Addr]time.Duration{}
	}
	for _, a := range addrs {
		ch.resolved[set][a.Unmap().WithZone("")] = ttl
	}
	return nil
}

// Flows fakes the conntrack table, flows found by their slot's mark.
type Flows Kernel

func (fl *Flows) k() *Kernel { return (*Kernel)(fl) }

// Flush deletes every flow of slot.
func (fl *Flows) Flush(ctx context.Context, slot netpolicy.Slot) error {
	k := fl.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.refused(journal.KindConntrack, strconv.FormatUint(uint64(slot), 10)); err != nil {
		return fmt.Errorf("conntrack flush mark %d: %w", slot, err)
	}
	if len(k.flows[slot]) > 0 {
		k.call("conntrack flush %d", slot)
	}
	delete(k.flows, slot)
	return nil
}

// CheckGone: no flow has slot's mark.
func (fl *Flows) CheckGone(ctx context.Context, slot netpolicy.Slot) (bool, string) {
	k := fl.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	if n := len(k.flows[slot]); n > 0 {
		return false, fmt.Sprintf("%d flow(s) with mark %d, first %s", n, slot, k.flows[slot][0])
	}
	return true, fmt.Sprintf("no flow with mark %d", slot)
}

// Cut deletes slot's flows that eff does not allow, by the real
// conntrack's rule (flows.Keep, without resolved addresses: a flow that
// only a domain set allows is cut, as conntrack cannot tell which name its
// address was answered for). The fake's flows are the slot's sandbox's:
// their source is eff's.
func (fl *Flows) Cut(ctx context.Context, slot netpolicy.Slot, eff netpolicy.Effective) (int, error) {
	k := fl.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	var keep []Flow
	cut := 0
	for _, f := range k.flows[slot] {
		if flows.Keep(f.tuple(eff), eff, nil) {
			keep = append(keep, f)
		} else {
			cut++
		}
	}
	if cut > 0 {
		k.flows[slot] = keep
		k.call("conntrack cut %d: %d", slot, cut)
	}
	return cut, nil
}

// tuple is f as conntrack has it, sent from eff's source address.
func (f Flow) tuple(eff netpolicy.Effective) flows.Tuple {
	t := flows.Tuple{Src: eff.Source4, Dst: f.Dst.Addr(), DstPort: f.Dst.Port()}
	if t.Dst.Is6() {
		t.Src = eff.Source6
	}
	t.Proto = unix.IPPROTO_UDP
	if f.Proto == netpolicy.ProtoTCP {
		t.Proto = unix.IPPROTO_TCP
	}
	return t
}

// DNSProxy fakes the DNS proxy's registry.
type DNSProxy Kernel

func (d *DNSProxy) k() *Kernel { return (*Kernel)(d) }

// Register makes or replaces o's entry.
func (d *DNSProxy) Register(o netpolicy.Owner, eff netpolicy.Effective) {
	k := d.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	k.dns[o.Block.Slot] = dnsEntry{owner: o, eff: eff}
}

// Unregister forgets slot's entry.
func (d *DNSProxy) Unregister(slot netpolicy.Slot) {
	k := d.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.dns, slot)
}

// Answer is what the proxy does with an answer of name for slot's
// sandbox: the addresses go into the domain set of the registered policy
// that allows name (exact or "*.suffix"); ok is false when none does.
func (d *DNSProxy) Answer(ctx context.Context, slot netpolicy.Slot, name string, addrs []netip.Addr, ttl time.Duration) (ok bool, err error) {
	k := d.k()
	k.mu.Lock()
	e, found := k.dns[slot]
	k.mu.Unlock()
	if !found {
		return false, nil
	}
	for i, ds := range e.eff.Domains {
		if slices.ContainsFunc(ds.Names, func(p string) bool {
			suffix, wild := strings.CutPrefix(p, "*")
			return p == name || wild && strings.HasSuffix(name, suffix)
		}) {
			return true, k.Firewall().AllowResolved(ctx, e.owner, i, addrs, ttl)
		}
	}
	return false, nil
}

func sameDomainSet(a, b netpolicy.DomainSet) bool {
	return a.Proto == b.Proto && slices.Equal(a.Names, b.Names) && slices.Equal(a.Ports, b.Ports)
}

// Registered reports whether slot has an entry.
func (d *DNSProxy) Registered(slot netpolicy.Slot) bool {
	k := d.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	_, ok := k.dns[slot]
	return ok
}
