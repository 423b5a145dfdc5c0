// Package netbench holds the sandbox network's scale tests and benchmarks
// at the subsystem level (netpolicy.Netns, Links, the address pool,
// nft.Firewall, flows.Conntrack), in the test VM: a churn test that makes
// and removes many generations' networks and checks the node returns to
// its baseline, and benchmarks of the packet path and of the network step
// at 1 and 500 live generations (issue 8).
package netbench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/ti-mo/conntrack"
	vnl "github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/netpolicy"
	"github.com/ctld/ctld/internal/netpolicy/flows"
	"github.com/ctld/ctld/internal/netpolicy/nft"
)

// The rig is the VM's root netns playing the node: a firewall table of
// the package's own (so no other package's test meets it), the real
// Links, Netns and Conntrack, and a test host (ktest.NewTestHost) as the
// sandboxes' destination.
const (
	table   = "ctldnb"
	dnsPort = 10153
	// lowSlots are held back from the pool: other packages' kernel tests
	// name links ctl-<slot> with small slots, so this package's links
	// start above them.
	lowSlots = 1023
)

// pool is large enough for 500 live generations above lowSlots.
var pool = netpolicy.Pool{V4: netip.MustParsePrefix("10.240.0.0/16")}

type rig struct {
	tb    testing.TB
	ctx   context.Context
	log   *slog.Logger
	fw    *nft.Firewall
	links *netpolicy.Links
	ns    *netpolicy.Netns
	ct    *flows.Conntrack
	host  *ktest.TestHost
	used  []netpolicy.Slot // slots held (Pool.Alloc's input)
}

// newRig turns forwarding on (restored at the end), starts a test host
// with extra ports, and ensures the firewall table (deleted at the end).
// quiet drops the subsystems' info logs (benchmarks make thousands).
func newRig(tb testing.TB, quiet bool) *rig {
	tb.Helper()
	ktest.Require(tb)
	ktest.RequireBinary(tb, "nft")
	ctx := context.Background()
	level := slog.LevelInfo
	if quiet {
		level = slog.LevelWarn
	}
	log := slog.New(slog.NewTextHandler(tb.Output(), &slog.HandlerOptions{Level: level}))
	r := &rig{tb: tb, ctx: ctx, log: log,
		links: &netpolicy.Links{Logger: log},
		ns:    &netpolicy.Netns{Prefix: "ctldnb-", Logger: log},
		ct:    &flows.Conntrack{Logger: log},
	}
	for s := netpolicy.Slot(1); s <= lowSlots; s++ {
		r.used = append(r.used, s)
	}
	const fwd = "/proc/sys/net/ipv4/ip_forward"
	old, err := os.ReadFile(fwd)
	if err != nil {
		tb.Fatal(err)
	}
	if err := r.links.EnableForwarding(ctx, false); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.WriteFile(fwd, old, 0o644) })
	r.host = ktest.NewTestHost(tb, ktest.TestHostOptions{TCP: []uint16{8080, 8081}, UDP: []uint16{5353}})
	r.fw, err = nft.New(nft.Config{Table: table, DNSPort: dnsPort, Pool: pool}, log)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(r.deleteTable)
	if err := r.fw.Ensure(ctx); err != nil {
		tb.Fatal(err)
	}
	return r
}

func (r *rig) deleteTable() {
	c, err := nftables.New()
	if err != nil {
		r.tb.Error(err)
		return
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		r.tb.Error(err)
		return
	}
	if !slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == table }) {
		return
	}
	c.DelTable(&nftables.Table{Name: table, Family: nftables.TableFamilyINet})
	if err := c.Flush(); err != nil {
		r.tb.Errorf("delete table %s: %v", table, err)
	}
}

// dropTable deletes t if it exists.
func (r *rig) dropTable(t *nftables.Table) {
	c, err := nftables.New()
	if err != nil {
		r.tb.Fatal(err)
	}
	tables, err := c.ListTablesOfFamily(t.Family)
	if err != nil {
		r.tb.Fatal(err)
	}
	if !slices.ContainsFunc(tables, func(x *nftables.Table) bool { return x.Name == t.Name }) {
		return
	}
	c.DelTable(t)
	if err := c.Flush(); err != nil {
		r.tb.Fatalf("delete table %s: %v", t.Name, err)
	}
}

// masquerade makes t (deleted first if it exists) with one postrouting
// rule: src masqueraded, the node's NAT for one client and nothing else.
func (r *rig) masquerade(t *nftables.Table, src netip.Addr) {
	r.dropTable(t)
	c, err := nftables.New()
	if err != nil {
		r.tb.Fatal(err)
	}
	c.AddTable(t)
	accept := nftables.ChainPolicyAccept
	ch := c.AddChain(&nftables.Chain{Name: "post", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: src.AsSlice()},
		&expr.Masq{},
	}})
	if err := c.Flush(); err != nil {
		r.tb.Fatalf("make table %s: %v", t.Name, err)
	}
}

// gen is one generation's network as the node makes it: a named netns,
// the veth pair into it, and its nft objects.
type gen struct {
	owner netpolicy.Owner
	name  string // netns name (the generation name)
	path  string
	id    netpolicy.NSID
	h     netns.NsHandle // open while the generation lives (for dialing)
}

func (g *gen) netns() ktest.Netns { return ktest.Netns{Path: g.path, Handle: g.h} }

// policy is a restricted policy allowing the test host's Addr4 on tcp
// ports and udp 5353.
func (r *rig) policy(tcpPorts ...string) netpolicy.Policy {
	r.tb.Helper()
	dst := netip.PrefixFrom(r.host.Addr4, 32).String()
	p, err := netpolicy.ParseDefault("network", netpolicy.Spec{Mode: "restricted", Rules: []netpolicy.RuleSpec{
		{CIDR: dst, Protocol: "tcp", Ports: tcpPorts},
		{CIDR: dst, Protocol: "udp", Ports: []string{"5353"}},
	}})
	if err != nil {
		r.tb.Fatal(err)
	}
	return p
}

func (r *rig) effective(g *gen, p netpolicy.Policy) netpolicy.Effective {
	return netpolicy.Resolve(p, netpolicy.Facts{Pool: pool, Block: g.owner.Block})
}

// alloc takes a slot from the pool and returns the generation's owner.
func (r *rig) alloc(id string) *gen {
	r.tb.Helper()
	s, err := pool.Alloc(r.used)
	if err != nil {
		r.tb.Fatal(err)
	}
	r.used = append(r.used, s)
	b, err := pool.Block(s)
	if err != nil {
		r.tb.Fatal(err)
	}
	o := netpolicy.Owner{ID: id, Generation: 1, Block: b}
	return &gen{owner: o, name: o.Alias()}
}

func (r *rig) free(s netpolicy.Slot) {
	r.used = slices.DeleteFunc(r.used, func(x netpolicy.Slot) bool { return x == s })
}

// makeNetns creates g's netns and opens a handle on it.
func (r *rig) makeNetns(g *gen) {
	r.tb.Helper()
	var err error
	if g.path, err = r.ns.Create(r.ctx, g.name); err != nil {
		r.tb.Fatal(err)
	}
	if g.id, err = r.ns.Identify(r.ctx, g.name); err != nil {
		r.tb.Fatal(err)
	}
	if g.h, err = netns.GetFromPath(g.path); err != nil {
		r.tb.Fatal(err)
	}
}

// make is a generation's whole network: netns, links, policy.
func (r *rig) make(g *gen, p netpolicy.Policy) {
	r.tb.Helper()
	r.makeNetns(g)
	if err := r.links.Make(r.ctx, g.owner, g.path); err != nil {
		r.tb.Fatal(err)
	}
	if err := r.fw.Apply(r.ctx, g.owner, r.effective(g, p)); err != nil {
		r.tb.Fatal(err)
	}
}

// remove undoes make in the node's release order (firewall, flows,
// links, netns) and returns the slot to the pool.
func (r *rig) remove(g *gen) error {
	var errs []error
	if err := r.fw.Remove(r.ctx, g.owner); err != nil {
		errs = append(errs, err)
	}
	if err := r.ct.Flush(r.ctx, g.owner.Block.Slot); err != nil {
		errs = append(errs, err)
	}
	if err := r.links.Remove(r.ctx, g.owner.Link()); err != nil {
		errs = append(errs, err)
	}
	if g.h.IsOpen() {
		if err := g.h.Close(); err != nil {
			errs = append(errs, err)
		}
		g.h = netns.None()
	}
	if g.path != "" {
		if err := r.ns.Delete(r.ctx, g.name); err != nil {
			errs = append(errs, err)
		}
	}
	r.free(g.owner.Block.Slot)
	if len(errs) > 0 {
		return fmt.Errorf("remove %s: %v", g.name, errs)
	}
	return nil
}

// checkGone is each subsystem's cleanup proof for g; it returns what
// failed.
func (r *rig) checkGone(g *gen) []string {
	var bad []string
	check := func(what string, ok bool, detail string) {
		if !ok {
			bad = append(bad, fmt.Sprintf("%s %s: %s", g.name, what, detail))
		}
	}
	ok, d := r.fw.CheckGone(r.ctx, g.owner)
	check("nft", ok, d)
	ok, d = r.ct.CheckGone(r.ctx, g.owner.Block.Slot)
	check("conntrack", ok, d)
	ok, d = r.links.CheckGone(r.ctx, g.owner)
	check("links", ok, d)
	ok, d = r.ns.CheckGone(r.ctx, g.name, g.id)
	check("netns", ok, d)
	return bad
}

// dialTCP connects from g's netns to the test host's port.
func (r *rig) dialTCP(g *gen, port uint16, timeout time.Duration) (net.Conn, error) {
	return dialFrom(g.netns(), netip.AddrPortFrom(r.host.Addr4, port), timeout)
}

func dialFrom(ns ktest.Netns, dst netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := ns.Do(func() (err error) {
		c, err = net.DialTimeout("tcp", dst.String(), timeout)
		return err
	})
	return c, err
}

// echoTCP sends a line on c and checks the test host's answer.
func echoTCP(c net.Conn, line string) error {
	if err := c.SetDeadline(time.Now().Add(3 * time.Second)); err != nil {
		return err
	}
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return err
	}
	buf := make([]byte, 256)
	n, err := c.Read(buf)
	if err != nil {
		return err
	}
	if !bytes.HasPrefix(buf[:n], []byte(line+" from ")) {
		return fmt.Errorf("echo of %q: got %q", line, buf[:n])
	}
	return nil
}

// echoUDP sends a datagram from g's netns to the test host's port 5353
// and waits for the answer.
func (r *rig) echoUDP(g *gen) error {
	var c net.Conn
	if err := g.netns().Do(func() (err error) {
		c, err = net.Dial("udp", netip.AddrPortFrom(r.host.Addr4, 5353).String())
		return err
	}); err != nil {
		return err
	}
	defer c.Close()
	return echoTCP(c, "udp "+g.name)
}

// state is what the churn test compares with its baseline, as data.
type state struct {
	Ruleset   []string // nft -j list ruleset: one entry per object, counters zeroed
	Links     []string // root netns: name type alias
	Addrs     []string // root netns: link address/bits
	Netns     []string // named netns (Netns.List of the rig's prefix and /run/netns)
	Mounts    []string
	Conntrack []string // the root netns's flows: tuple and mark
}

func (r *rig) state() state {
	r.tb.Helper()
	var s state
	s.Ruleset = ktest.NftRuleset(r.tb)
	root, err := vnl.NewHandle()
	if err != nil {
		r.tb.Fatal(err)
	}
	defer root.Close()
	links, err := root.LinkList()
	if err != nil {
		r.tb.Fatal(err)
	}
	names := map[int]string{}
	for _, l := range links {
		a := l.Attrs()
		names[a.Index] = a.Name
		s.Links = append(s.Links, fmt.Sprintf("%s %s %q", a.Name, l.Type(), a.Alias))
	}
	addrs, err := root.AddrList(nil, vnl.FAMILY_ALL)
	if err != nil {
		r.tb.Fatal(err)
	}
	for _, a := range addrs {
		s.Addrs = append(s.Addrs, fmt.Sprintf("%s %v", names[a.LinkIndex], a.IPNet))
	}
	if s.Netns, err = r.ns.List(r.ctx); err != nil {
		r.tb.Fatal(err)
	}
	snap, err := ktest.Snapshot(ktest.SnapshotOptions{})
	if err != nil {
		r.tb.Fatal(err)
	}
	s.Netns = append(s.Netns, snap.Netns...)
	s.Mounts = snap.Mounts
	c, err := conntrack.Dial(nil)
	if err != nil {
		r.tb.Fatal(err)
	}
	defer c.Close()
	fs, err := c.Dump(nil)
	if err != nil {
		r.tb.Fatal(err)
	}
	for _, f := range fs {
		o := f.TupleOrig
		s.Conntrack = append(s.Conntrack, fmt.Sprintf("proto %d %v:%d -> %v:%d mark %#x", o.Proto.Protocol,
			o.IP.SourceAddress, o.Proto.SourcePort, o.IP.DestinationAddress, o.Proto.DestinationPort, f.Mark))
	}
	for _, xs := range [][]string{s.Ruleset, s.Links, s.Addrs, s.Netns, s.Mounts, s.Conntrack} {
		slices.Sort(xs)
	}
	return s
}

// diff lists, per kind, what one state has that the other has not. A
// baseline flow that is gone is not reported: flows of earlier tests expire
// on their own while the churn runs; only flows the churn added are leaks.
func diff(before, after state) []string {
	var out []string
	one := func(kind string, b, a []string) {
		expires := kind == "conntrack"
		var gone, extra []string
		for _, x := range b {
			if !slices.Contains(a, x) {
				gone = append(gone, x)
			}
		}
		for _, x := range a {
			if !slices.Contains(b, x) {
				extra = append(extra, x)
			}
		}
		if len(extra) > 0 {
			out = append(out, fmt.Sprintf("%s: %d more than the baseline:\n\t%s", kind, len(extra), strings.Join(extra, "\n\t")))
		}
		if len(gone) > 0 && !expires {
			out = append(out, fmt.Sprintf("%s: %d of the baseline missing:\n\t%s", kind, len(gone), strings.Join(gone, "\n\t")))
		}
	}
	one("nft ruleset", before.Ruleset, after.Ruleset)
	one("links", before.Links, after.Links)
	one("addresses", before.Addrs, after.Addrs)
	one("netns", before.Netns, after.Netns)
	one("mounts", before.Mounts, after.Mounts)
	one("conntrack", before.Conntrack, after.Conntrack)
	return out
}
