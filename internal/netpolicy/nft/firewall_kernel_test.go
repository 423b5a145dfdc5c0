package nft

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/ti-mo/conntrack"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/netpolicy"
)

// The kernel tests run in the VM's root netns, which plays the node: a
// client netns per sandbox joined by a veth named like a sandbox link
// (ctl-<slot>, the block's addresses), and a server netns behind a veth
// the node routes to. Packets are real: TCP connects and UDP round trips
// from the client to the server pass the table's forward hook.

var (
	testPool = netpolicy.Pool{V4: netip.MustParsePrefix("10.200.0.0/24"), V6: netip.MustParsePrefix("fd00:c71d::/64")}
	// The server's addresses are documentation ranges: not reserved.
	serverAddr  = netip.MustParseAddr("192.0.2.2")
	serverAddr6 = netip.MustParseAddr("2001:db8::2")
	nodeSide    = "192.0.2.1/24"
	nodeSide6   = netip.MustParsePrefix("2001:db8::1/64")
	testPort    = uint16(15353)
)

// node is the VM's root netns prepared for one test.
type node struct {
	t      *testing.T
	fw     *Firewall
	server ktest.Netns
}

// newNode checks for leaks, records `nft -j list ruleset` and checks it
// is the same when the test ends, turns IPv4 forwarding on (restored at
// the end), makes the server netns with TCP and UDP echo servers, and
// makes the firewall with the table ensured (deleted at the end).
func newNode(t *testing.T) *node {
	ktest.Require(t)
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	ktest.RequireBinary(t, "nft")
	before := ruleset(t)
	t.Cleanup(func() {
		if after := ruleset(t); after != before {
			t.Errorf("nft ruleset after the test differs from the baseline:\nbefore %s\nafter  %s", before, after)
		}
	})
	ktest.Forwarding(t)

	n := &node{t: t, server: ktest.NewNetns(t)}
	ktest.VethPair(t, ktest.Veth{Netns: netns.None(), Name: "kt-srv0", Addr: nodeSide},
		ktest.Veth{Netns: n.server.Handle, Name: "eth0", Addr: serverAddr.String() + "/24"})
	addAddr6(t, netns.None(), "kt-srv0", nodeSide6)
	addAddr6(t, n.server.Handle, "eth0", netip.PrefixFrom(serverAddr6, 64))
	for _, port := range []uint16{8080, 8081} {
		n.tcpEcho(n.server.Do, netip.AddrPortFrom(serverAddr, port).String())
	}
	for _, port := range []uint16{9090, 9091} {
		n.udpEcho(n.server.Do, netip.AddrPortFrom(serverAddr, port).String())
	}
	fw, err := New(Config{DNSPort: testPort, Pool: testPool}, slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err != nil {
		t.Fatal(err)
	}
	n.fw = fw
	t.Cleanup(func() {
		if err := ktest.DeleteNftTable(fw.table().Name); err != nil {
			t.Errorf("delete table: %v", err)
		}
	})
	if err := fw.Ensure(context.Background()); err != nil {
		t.Fatal(err)
	}
	return n
}

// ruleset is ktest.NftRuleset as one string: counters zeroed, since the
// sandboxes' router solicitations hit the input chain's drop counter at
// any time.
func ruleset(t *testing.T) string {
	t.Helper()
	return strings.Join(ktest.NftRuleset(t), "\n")
}

// inRoot runs fn in the test's own netns: the node's.
func inRoot(fn func() error) error { return fn() }

// tcpEcho serves a TCP echo on addr, in the netns in runs functions in.
func (n *node) tcpEcho(in func(func() error) error, addr string) {
	var ln net.Listener
	if err := in(func() (err error) {
		ln, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		n.t.Fatal(err)
	}
	ktest.EchoTCP(n.t, ln)
}

// udpEcho serves a UDP echo on addr, in the netns in runs functions in.
func (n *node) udpEcho(in func(func() error) error, addr string) {
	var pc net.PacketConn
	if err := in(func() (err error) {
		pc, err = net.ListenPacket("udp", addr)
		return err
	}); err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { _ = pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			k, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(buf[:k], from)
		}
	}()
}

// sandbox is a client netns joined to the node like a sandbox of slot.
type sandbox struct {
	n     *node
	owner netpolicy.Owner
	ns    ktest.Netns
}

func (n *node) sandbox(slot netpolicy.Slot) *sandbox {
	t := n.t
	b, err := testPool.Block(slot)
	if err != nil {
		t.Fatal(err)
	}
	s := &sandbox{n: n, owner: netpolicy.Owner{ID: fmt.Sprintf("kt-%d", slot), Generation: 1, Block: b}, ns: ktest.NewNetns(t)}
	ktest.VethPair(t, ktest.Veth{Netns: netns.None(), Name: s.owner.Link(), Addr: netip.PrefixFrom(b.Gateway4, b.Net4.Bits()).String()},
		ktest.Veth{Netns: s.ns.Handle, Name: "eth0", Addr: netip.PrefixFrom(b.Addr4, b.Net4.Bits()).String()})
	h, l := linkIn(t, s.ns.Handle, "eth0")
	if err := h.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.IP(b.Gateway4.AsSlice())}); err != nil {
		t.Fatalf("default route in %s: %v", s.owner.Link(), err)
	}
	addAddr6(t, netns.None(), s.owner.Link(), netip.PrefixFrom(b.Gateway6, b.Net6.Bits()))
	addAddr6(t, s.ns.Handle, "eth0", netip.PrefixFrom(b.Addr6, b.Net6.Bits()))
	if err := h.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.IP(b.Gateway6.AsSlice())}); err != nil {
		t.Fatalf("default v6 route in %s: %v", s.owner.Link(), err)
	}
	return s
}

// applied is a sandbox of slot with policy p applied, removed when the
// test ends.
func (n *node) applied(slot netpolicy.Slot, p netpolicy.Policy) *sandbox {
	s := n.sandbox(slot)
	n.t.Cleanup(func() { _ = n.fw.Remove(context.Background(), s.owner) })
	s.apply(p)
	return s
}

// apply applies p to the sandbox's generation.
func (s *sandbox) apply(p netpolicy.Policy) {
	s.n.t.Helper()
	if err := s.n.fw.Apply(context.Background(), s.owner, s.effective(p)); err != nil {
		s.n.t.Fatal(err)
	}
}

// linkIn is the link name in ns, and a netlink handle in ns (closed
// when the test ends) to change it with.
func linkIn(t *testing.T, ns netns.NsHandle, name string) (*netlink.Handle, netlink.Link) {
	t.Helper()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatalf("link %s: %v", name, err)
	}
	return h, l
}

// addAddr6 adds an IPv6 address without duplicate address detection (so
// it is usable at once) to the link name in ns.
func addAddr6(t *testing.T, ns netns.NsHandle, name string, p netip.Prefix) {
	t.Helper()
	h, l := linkIn(t, ns, name)
	a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 128)}, Flags: unix.IFA_F_NODAD}
	if err := h.AddrAdd(l, a); err != nil {
		t.Fatalf("add %v to %s: %v", p, name, err)
	}
}

func (s *sandbox) effective(p netpolicy.Policy) netpolicy.Effective {
	return netpolicy.Resolve(p, netpolicy.Facts{Pool: testPool, Block: s.owner.Block})
}

func policy(t *testing.T, mode netpolicy.Mode, rules ...netpolicy.RuleSpec) netpolicy.Policy {
	t.Helper()
	p, err := netpolicy.ParseDefault("network", netpolicy.Spec{Mode: string(mode), Rules: rules})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func cidr(c, proto string, ports ...string) netpolicy.RuleSpec {
	return netpolicy.RuleSpec{CIDR: c, Protocol: proto, Ports: ports}
}

func domain(d, proto string, ports ...string) netpolicy.RuleSpec {
	return netpolicy.RuleSpec{Domain: d, Protocol: proto, Ports: ports}
}

// dial connects from the sandbox to the server's port, from src if set.
func (s *sandbox) dial(port int, src netip.Addr) (net.Conn, error) {
	return s.dialTo(netip.AddrPortFrom(serverAddr, uint16(port)), src)
}

// dialTo connects from the sandbox to dst, from src if set.
func (s *sandbox) dialTo(dst netip.AddrPort, src netip.Addr) (net.Conn, error) {
	var c net.Conn
	err := s.ns.Do(func() (err error) {
		d := net.Dialer{Timeout: 1500 * time.Millisecond}
		if src.IsValid() {
			d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
		}
		c, err = d.Dial("tcp", dst.String())
		return err
	})
	return c, err
}

// addSpoof adds addr to the sandbox's own link, and a route back to it
// on the node, so only the firewall stands between a packet from addr and
// its destination.
func (s *sandbox) addSpoof(addr netip.Addr) {
	t := s.n.t
	t.Helper()
	h, l := linkIn(t, s.ns.Handle, "eth0")
	if err := h.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
		t.Fatal(err)
	}
	hostLink, err := netlink.LinkByName(s.owner.Link())
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: hostLink.Attrs().Index, Dst: &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
		t.Fatal(err)
	}
}

func (s *sandbox) canConnect(port int) bool {
	return s.canConnectTo(netip.AddrPortFrom(serverAddr, uint16(port)))
}

func (s *sandbox) canConnectTo(dst netip.AddrPort) bool {
	c, err := s.dialTo(dst, netip.Addr{})
	if err != nil {
		return false
	}
	defer c.Close()
	return echo(c) == nil
}

// echo writes a line and reads it back.
func echo(c net.Conn) error {
	_ = c.SetDeadline(time.Now().Add(1500 * time.Millisecond))
	msg := []byte("ping\n")
	if _, err := c.Write(msg); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if !bytes.Equal(got, msg) {
		return fmt.Errorf("echo %q, want %q", got, msg)
	}
	return nil
}

// udpRoundTrip sends a datagram to the server's port and waits for the echo.
func (s *sandbox) udpRoundTrip(port int) bool {
	return s.udpRoundTripTo(netip.AddrPortFrom(serverAddr, uint16(port)))
}

func (s *sandbox) udpRoundTripTo(dst netip.AddrPort) bool {
	var c net.Conn
	if err := s.ns.Do(func() (err error) {
		c, err = net.Dial("udp", dst.String())
		return err
	}); err != nil {
		s.n.t.Fatal(err)
	}
	defer c.Close()
	return echo(c) == nil
}

func TestKernelApplyEnforcesPolicy(t *testing.T) {
	n := newNode(t)
	ctx := context.Background()
	sb := n.sandbox(3)
	carrier := n.sandbox(4) // a link with no generation: no fwd element
	t.Cleanup(func() {
		if err := n.fw.Remove(ctx, sb.owner); err != nil {
			t.Errorf("remove: %v", err)
		}
	})

	// Before Apply the link has no fwd element: the base chain drops.
	if sb.canConnect(8080) {
		t.Fatal("connected before any policy was applied")
	}
	eff := sb.effective(policy(t, netpolicy.ModeRestricted, cidr("192.0.2.2/32", "tcp", "8080"), cidr("192.0.2.2/32", "udp", "9090")))
	if err := n.fw.Apply(ctx, sb.owner, eff); err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name string
		got  bool
		want bool
	}{
		{"tcp 8080 (allowed)", sb.canConnect(8080), true},
		{"tcp 8081 (other port)", sb.canConnect(8081), false},
		{"udp 9090 (allowed)", sb.udpRoundTrip(9090), true},
		{"udp 9091 (other port)", sb.udpRoundTrip(9091), false},
		{"carrier without a chain, tcp 8080", carrier.canConnect(8080), false},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: connected %v, want %v", c.name, c.got, c.want)
		}
	}

	// A spoofed source (an address the sandbox adds to its own link)
	// is dropped even to an allowed destination.
	spoof := netip.MustParseAddr("10.200.0.99")
	sb.addSpoof(spoof)
	if c, err := sb.dial(8080, spoof); err == nil {
		c.Close()
		t.Error("a spoofed source connected")
	}

	// The allow set reads back as the policy's elements (Key and KeyEnd).
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	els, err := c.GetSetElements(&nftables.Set{Table: n.fw.table(), Name: netpolicy.SetName(sb.owner.ID, sb.owner.Generation, "a4")})
	if err != nil {
		t.Fatal(err)
	}
	var back []netpolicy.Element
	for _, e := range els {
		if e.IntervalEnd {
			continue
		}
		pe, err := netpolicy.ParseElement(e.Key, e.KeyEnd)
		if err != nil {
			t.Fatal(err)
		}
		back = append(back, pe)
	}
	slices.SortFunc(back, func(a, b netpolicy.Element) int { return strings.Compare(a.String(), b.String()) })
	want := slices.Clone(eff.Allow4)
	slices.SortFunc(want, func(a, b netpolicy.Element) int { return strings.Compare(a.String(), b.String()) })
	if !reflect.DeepEqual(back, want) {
		t.Errorf("a4 elements read back:\n%v\nwant\n%v", back, want)
	}

	// Counters: the accepted connections and datagrams were sent, the
	// refused ones dropped.
	cnt, err := n.fw.Counters(ctx, sb.owner)
	if err != nil {
		t.Fatal(err)
	}
	if cnt.TxPackets == 0 || cnt.TxBytes == 0 || cnt.DroppedPackets == 0 {
		t.Errorf("counters %+v: want tx and dropped packets", cnt)
	}
	if got, err := n.fw.List(ctx); err != nil || !reflect.DeepEqual(got, []string{sb.owner.Chain()}) {
		t.Errorf("List = %v, %v; want [%s]", got, err, sb.owner.Chain())
	}
	if ok, detail := n.fw.CheckGone(ctx, sb.owner); ok {
		t.Errorf("CheckGone before Remove = ok (%s)", detail)
	}

	// Remove, twice (idempotent); then nothing of it is left.
	for i := 0; i < 2; i++ {
		if err := n.fw.Remove(ctx, sb.owner); err != nil {
			t.Fatalf("remove %d: %v", i, err)
		}
	}
	if ok, detail := n.fw.CheckGone(ctx, sb.owner); !ok {
		t.Errorf("CheckGone after Remove: %s", detail)
	}
	if got, err := n.fw.List(ctx); err != nil || len(got) != 0 {
		t.Errorf("List after Remove = %v, %v", got, err)
	}
	if sb.canConnect(8080) {
		t.Error("connected after Remove")
	}
}

func TestKernelEnsureIsIdempotent(t *testing.T) {
	n := newNode(t)
	ctx := context.Background()
	sb := n.applied(5, policy(t, netpolicy.ModeRestricted, cidr("192.0.2.2/32", "tcp", "8080")))
	before := ruleset(t)
	if err := n.fw.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if after := ruleset(t); after != before {
		t.Errorf("a second Ensure changed the ruleset:\nbefore %s\nafter  %s", before, after)
	}
	// A new configuration replaces the base rules and keeps the
	// generation's objects.
	fw2, err := New(Config{DNSPort: testPort + 1, Pool: testPool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := fw2.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	after := ruleset(t)
	if !strings.Contains(after, fmt.Sprintf("dns-port %d", testPort+1)) || strings.Contains(after, fmt.Sprintf("dns-port %d ", testPort)) {
		t.Errorf("base rules not replaced: %s", after)
	}
	if !sb.canConnect(8080) {
		t.Error("the generation lost its policy when the base chains were replaced")
	}

	// A table made before base v4 has no src elements: a new base adds
	// one for each dns element, so its sandboxes' DNS goes on.
	gw := netip.AddrPortFrom(sb.owner.Block.Gateway4, 53)
	proxy := netip.AddrPortFrom(netip.IPv6Unspecified(), testPort+1).String()
	n.tcpEcho(inRoot, proxy)
	if !sb.canConnectTo(gw) {
		t.Fatal("tcp gateway:53 did not reach the proxy")
	}
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	src4 := &nftables.Set{Table: n.fw.table(), Name: MapSrc4, IsMap: true}
	key := append(ifname(sb.owner.Link()), sb.owner.Block.Addr4.AsSlice()...)
	if err := c.SetDeleteElements(src4, []nftables.SetElement{{Key: key}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if sb.canConnectTo(gw) {
		t.Fatal("tcp gateway:53 reached the proxy without a src4 element")
	}
	if err := n.fw.Ensure(ctx); err != nil { // the first configuration: another base
		t.Fatal(err)
	}
	els, err := c.GetSetElements(src4)
	if err != nil {
		t.Fatal(err)
	}
	if len(els) != 1 || !bytes.Equal(els[0].Key, key) || !bytes.Equal(els[0].Val, binaryutil.NativeEndian.PutUint32(uint32(sb.owner.Block.Slot))) {
		t.Errorf("src4 after Ensure: %+v", els)
	}
	n.tcpEcho(inRoot, netip.AddrPortFrom(netip.IPv6Unspecified(), testPort).String())
	if !sb.canConnectTo(gw) {
		t.Error("tcp gateway:53 did not reach the proxy after Ensure added the src4 element")
	}
}

func TestKernelReplaceKeepsEstablishedFlows(t *testing.T) {
	n := newNode(t)
	ctx := context.Background()
	sb := n.applied(6, policy(t, netpolicy.ModeRestricted, cidr("192.0.2.2/32", "tcp", "8080")))
	c, err := sb.dial(8080, netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := echo(c); err != nil {
		t.Fatal(err)
	}
	// The chain marked the flow with the slot (under the mask).
	ct, err := conntrack.Dial(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ct.Close()
	flows, err := ct.DumpFilter(conntrack.NewFilter().Mark(uint32(sb.owner.Block.Slot)).MarkMask(DefaultMarkMask), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(flows, func(f conntrack.Flow) bool {
		return f.TupleOrig.IP.DestinationAddress == serverAddr && f.TupleOrig.Proto.DestinationPort == 8080
	}) {
		t.Errorf("no conntrack flow to %v:8080 with mark %d: %v", serverAddr, sb.owner.Block.Slot, flows)
	}
	// Replace with a policy that also opens 8081: the open flow lives
	// on, the new port opens.
	sb.apply(policy(t, netpolicy.ModeRestricted, cidr("192.0.2.2/32", "tcp", "8080-8081")))
	if err := echo(c); err != nil {
		t.Errorf("established flow after replace: %v", err)
	}
	if !sb.canConnect(8081) {
		t.Error("8081 closed after a replace that opened it")
	}
	// Replace with deny_all: everything stops, the open flow too.
	sb.apply(policy(t, netpolicy.ModeDenyAll))
	if err := echo(c); err == nil {
		t.Error("the established flow still passes in deny_all")
	}
	if sb.canConnect(8080) {
		t.Error("deny_all connected")
	}
	cnt, err := n.fw.Counters(ctx, sb.owner)
	if err != nil {
		t.Fatal(err)
	}
	if cnt.TxPackets == 0 {
		t.Errorf("counters %+v: a replace lost the tx count", cnt)
	}
}

func TestKernelDomainSetTimeout(t *testing.T) {
	n := newNode(t)
	ctx := context.Background()
	sb := n.sandbox(7)
	t.Cleanup(func() { _ = n.fw.Remove(ctx, sb.owner) })
	eff := sb.effective(policy(t, netpolicy.ModeRestricted, domain("example.com", "tcp", "8080")))
	if len(eff.Domains) != 1 {
		t.Fatalf("domains %v", eff.Domains)
	}
	if err := n.fw.Apply(ctx, sb.owner, eff); err != nil {
		t.Fatal(err)
	}
	if sb.canConnect(8080) {
		t.Fatal("connected before the address was resolved")
	}
	// An answer may list an address twice (and as IPv4-mapped IPv6).
	dup := []netip.Addr{serverAddr, serverAddr, netip.AddrFrom16(serverAddr.As16())}
	if err := n.fw.AllowResolved(ctx, sb.owner, 0, dup, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	if !sb.canConnect(8080) {
		t.Fatal("resolved address not reachable")
	}
	if sb.canConnect(8081) {
		t.Error("resolved address reachable on a port the domain rule does not name")
	}

	// Does a plain add of an existing element refresh its timeout on this
	// kernel? Record it (the answer decides AllowResolved's batch), then
	// check AllowResolved refreshes either way.
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	set := &nftables.Set{Table: n.fw.table(), Name: DomainSetName(sb.owner, 0, false), HasTimeout: true}
	if err := c.SetAddElements(set, []nftables.SetElement{{Key: serverAddr.AsSlice(), Timeout: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	timeout := func() time.Duration {
		els, err := c.GetSetElements(set)
		if err != nil || len(els) != 1 {
			t.Fatalf("elements %v, %v", els, err)
		}
		return els[0].Timeout
	}
	t.Logf("kernel: after a plain re-add with timeout 1h the element's timeout is %v (3s before)", timeout())
	if err := n.fw.AllowResolved(ctx, sb.owner, 0, []netip.Addr{serverAddr}, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := timeout(); got != 2*time.Minute {
		t.Errorf("AllowResolved did not refresh the timeout: %v, want 2m", got)
	}

	// Expiry: a short timeout, then the destination closes again.
	if err := n.fw.AllowResolved(ctx, sb.owner, 0, []netip.Addr{serverAddr}, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if !sb.canConnect(8080) {
		t.Fatal("not reachable after refresh")
	}
	deadline := time.Now().Add(15 * time.Second)
	for sb.canConnect(8080) {
		if time.Now().After(deadline) {
			t.Fatal("still reachable 15 s after a 2 s element timeout")
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func TestKernelRemoveOrphan(t *testing.T) {
	n := newNode(t)
	ctx := context.Background()
	sb := n.sandbox(8)
	sb.apply(policy(t, netpolicy.ModeOpen))
	if !sb.canConnect(8081) || !sb.udpRoundTrip(9091) {
		t.Error("open mode did not pass tcp 8081 or udp 9091")
	}
	if err := n.fw.RemoveOrphan(ctx, sb.owner.Chain()+".tx"); err == nil {
		t.Error("RemoveOrphan accepted a counter name")
	}
	if err := n.fw.RemoveOrphan(ctx, sb.owner.Chain()); err != nil {
		t.Fatal(err)
	}
	if ok, detail := n.fw.CheckGone(ctx, sb.owner); !ok {
		t.Errorf("CheckGone after RemoveOrphan: %s", detail)
	}
	var err error
	if err = n.fw.RemoveOrphan(ctx, sb.owner.Chain()); err != nil {
		t.Error(errors.Join(errors.New("second RemoveOrphan"), err))
	}
}

// Remove of a generation whose slot now serves another generation leaves
// the other's dispatch and DNS elements alone.
func TestKernelRemoveLeavesTheSlotsNewOwner(t *testing.T) {
	n := newNode(t)
	ctx := context.Background()
	sb := n.applied(9, policy(t, netpolicy.ModeRestricted, cidr("192.0.2.2/32", "tcp", "8080")))
	old := sb.owner
	old.Generation = 0 // an earlier generation of the same slot, long gone
	old.ID = "kt-old"
	if err := n.fw.Remove(ctx, old); err != nil {
		t.Fatal(err)
	}
	if ok, detail := n.fw.CheckGone(ctx, old); ok {
		t.Errorf("CheckGone of the old owner = ok (%s): the slot's new fwd element must count as left", detail)
	}
	if !sb.canConnect(8080) {
		t.Error("the slot's new owner lost its policy")
	}
	dns4 := append(ifname(sb.owner.Link()), sb.owner.Block.Gateway4.AsSlice()...)
	if ok, _, err := n.fw.element(SetDNS4, dns4); err != nil || !ok {
		t.Errorf("the slot's new owner lost its dns4 element: %v, %v", ok, err)
	}
	if got, err := n.fw.List(ctx); err != nil || !reflect.DeepEqual(got, []string{sb.owner.Chain()}) {
		t.Errorf("List = %v, %v", got, err)
	}
}

// The sandbox's DNS to its gateway reaches the node's proxy port through
// the redirect, and nothing else on the node does.
func TestKernelDNSRedirect(t *testing.T) {
	n := newNode(t)
	ctx := context.Background()
	sb := n.sandbox(10)
	closed := n.sandbox(11)
	for _, s := range []*sandbox{sb, closed} {
		t.Cleanup(func() { _ = n.fw.Remove(ctx, s.owner) })
	}
	// A second resolver at the server: a rule naming its address
	// without ports does not open port 53.
	n.udpEcho(n.server.Do, netip.AddrPortFrom(serverAddr, 53).String())
	sb.apply(policy(t, netpolicy.ModeRestricted, cidr("192.0.2.2/32", "")))
	closed.apply(policy(t, netpolicy.ModeDenyAll))
	// The proxy: udp and tcp on the node, every address.
	proxy := netip.AddrPortFrom(netip.IPv6Unspecified(), testPort).String()
	n.tcpEcho(inRoot, proxy)
	n.udpEcho(inRoot, proxy)
	n.tcpEcho(inRoot, "[::]:18080") // another service of the node
	gw, gw6 := sb.owner.Block.Gateway4, sb.owner.Block.Gateway6
	for _, c := range []struct {
		name string
		got  bool
		want bool
	}{
		{"udp gateway:53", sb.udpRoundTripTo(netip.AddrPortFrom(gw, 53)), true},
		{"tcp gateway:53", sb.canConnectTo(netip.AddrPortFrom(gw, 53)), true},
		{"udp [gateway6]:53", sb.udpRoundTripTo(netip.AddrPortFrom(gw6, 53)), true},
		{"udp gateway:proxy port (not redirected)", sb.udpRoundTripTo(netip.AddrPortFrom(gw, testPort)), false},
		{"tcp gateway:18080 (a node service)", sb.canConnectTo(netip.AddrPortFrom(gw, 18080)), false},
		{"tcp node's uplink address:18080", sb.canConnectTo(netip.MustParseAddrPort("192.0.2.1:18080")), false},
		{"udp second resolver 192.0.2.2:53", sb.udpRoundTrip(53), false},
		{"udp 192.0.2.2:9090 (the rule's other ports)", sb.udpRoundTrip(9090), true},
		{"deny_all: udp gateway:53", closed.udpRoundTripTo(netip.AddrPortFrom(closed.owner.Block.Gateway4, 53)), false},
		{"deny_all: tcp 8080", closed.canConnect(8080), false},
	} {
		if c.got != c.want {
			t.Errorf("%s: got through %v, want %v", c.name, c.got, c.want)
		}
	}
	// The proxy takes a sandbox's DNS only from its own address: the
	// input rule's key is link . source.
	spoof := netip.MustParseAddr("10.200.0.98")
	sb.addSpoof(spoof)
	if c, err := sb.dialTo(netip.AddrPortFrom(gw, 53), spoof); err == nil {
		c.Close()
		t.Error("tcp gateway:53 from a spoofed source connected")
	}
	// The DNS-proxy flows (input path) carry the slot in their mark like
	// the forwarded ones, so a flush by mark (the release's conntrack
	// entry) leaves none of the sandbox's flows behind.
	ct, err := conntrack.Dial(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ct.Close()
	byMark := conntrack.NewFilter().Mark(uint32(sb.owner.Block.Slot)).MarkMask(DefaultMarkMask)
	marked, err := ct.DumpFilter(byMark, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct {
		dst   netip.Addr
		proto uint8
	}{{gw, protoUDP}, {gw, protoTCP}, {gw6, protoUDP}} {
		if !slices.ContainsFunc(marked, func(f conntrack.Flow) bool {
			return f.TupleOrig.IP.DestinationAddress == w.dst && f.TupleOrig.Proto.DestinationPort == 53 && f.TupleOrig.Proto.Protocol == w.proto
		}) {
			t.Errorf("no DNS-proxy flow to %v:53 (proto %d) with mark %d: %v", w.dst, w.proto, sb.owner.Block.Slot, marked)
		}
	}
	if err := ct.FlushFilter(byMark); err != nil {
		t.Fatal(err)
	}
	all, err := ct.Dump(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range all {
		if src := f.TupleOrig.IP.SourceAddress; src == sb.owner.Block.Addr4 || src == sb.owner.Block.Addr6 {
			t.Errorf("flow of the sandbox left after the flush by its mark: %v", f)
		}
	}
}

// TestKernelIPv6: IPv6 is policed like IPv4 (the allow set, other ports, spoofing).
func TestKernelIPv6(t *testing.T) {
	n := newNode(t)
	ctx := context.Background()
	sb := n.sandbox(12)
	t.Cleanup(func() { _ = n.fw.Remove(ctx, sb.owner) })
	for _, port := range []uint16{8080, 8081} {
		n.tcpEcho(n.server.Do, netip.AddrPortFrom(serverAddr6, port).String())
	}
	sb.apply(policy(t, netpolicy.ModeRestricted, cidr("2001:db8::2/128", "tcp", "8080")))
	if !sb.canConnectTo(netip.AddrPortFrom(serverAddr6, 8080)) {
		t.Error("v6 tcp 8080 (allowed) did not connect")
	}
	if sb.canConnectTo(netip.AddrPortFrom(serverAddr6, 8081)) {
		t.Error("v6 tcp 8081 (not allowed) connected")
	}
	if sb.canConnect(8080) {
		t.Error("v4 tcp 8080 connected: only the v6 address is allowed")
	}
	spoof := netip.MustParseAddr("fd00:c71d::99")
	addAddr6(t, sb.ns.Handle, "eth0", netip.PrefixFrom(spoof, 128))
	hostLink, err := netlink.LinkByName(sb.owner.Link())
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: hostLink.Attrs().Index, Dst: &net.IPNet{IP: spoof.AsSlice(), Mask: net.CIDRMask(128, 128)}}); err != nil {
		t.Fatal(err)
	}
	if c, err := sb.dialTo(netip.AddrPortFrom(serverAddr6, 8080), spoof); err == nil {
		c.Close()
		t.Error("a spoofed v6 source connected")
	}
}

// A replace keeps the addresses the proxy resolved for a domain set whose
// names, protocol and ports did not change, and drops them when they did.
func TestKernelReplaceKeepsResolvedAddresses(t *testing.T) {
	n := newNode(t)
	ctx := context.Background()
	sb := n.applied(13, policy(t, netpolicy.ModeRestricted, domain("example.com", "tcp", "8080")))
	apply := func(rules ...netpolicy.RuleSpec) { t.Helper(); sb.apply(policy(t, netpolicy.ModeRestricted, rules...)) }
	if err := n.fw.AllowResolved(ctx, sb.owner, 0, []netip.Addr{serverAddr}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if !sb.canConnect(8080) {
		t.Fatal("resolved address not reachable")
	}
	apply(domain("example.com", "tcp", "8080"), cidr("198.51.100.0/24", "tcp", "443"))
	if !sb.canConnect(8080) {
		t.Error("a replace that kept the domain rule dropped its resolved address")
	}
	apply(domain("example.org", "tcp", "8080"))
	if sb.canConnect(8080) {
		t.Error("a replace with other names kept the old names' resolved address")
	}
	// Two names of one port profile share a set; a replace that removes
	// one of them (the profile stays) empties the set: an address cannot
	// be told by the name it answered, so the other name re-resolves.
	apply(domain("example.org", "tcp", "8080"), domain("example.net", "tcp", "8080"))
	if err := n.fw.AllowResolved(ctx, sb.owner, 0, []netip.Addr{serverAddr}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if !sb.canConnect(8080) {
		t.Fatal("resolved address of the shared set not reachable")
	}
	apply(domain("example.net", "tcp", "8080"))
	if sb.canConnect(8080) {
		t.Error("a replace that removed a name of the set (same profile) kept its resolved address")
	}
}

// Apply is one transaction: when a part fails, nothing of it is made. A
// link that dispatches to another generation is refused (conflict)
// before anything is sent; an allow set the kernel refuses (an element
// whose start lies inside another one, which Resolve never makes: the
// kernel checks only the new element's start against the others) fails
// the whole transaction.
func TestKernelApplyIsAllOrNothing(t *testing.T) {
	n := newNode(t)
	ctx := context.Background()
	sb := n.sandbox(14)
	t.Cleanup(func() { _ = n.fw.Remove(ctx, sb.owner) })
	eff := sb.effective(policy(t, netpolicy.ModeRestricted, cidr("192.0.2.2/32", "tcp", "8080"), domain("example.com", "tcp", "443")))
	if err := n.fw.Apply(ctx, sb.owner, eff); err != nil {
		t.Fatal(err)
	}
	before := ruleset(t)
	other := sb.owner
	other.ID = "kt-other"
	if err := n.fw.Apply(ctx, other, eff); !errdefs.Is(err, errdefs.CodeConflict) {
		t.Errorf("Apply of a second generation on the same link: %v, want conflict", err)
	}
	third := n.sandbox(15)
	bad := third.effective(policy(t, netpolicy.ModeRestricted, cidr("192.0.2.0/24", "tcp", "8080")))
	bad.Allow4 = append(bad.Allow4, netpolicy.Element{
		Dst: netpolicy.AddrRange{From: serverAddr, To: serverAddr}, Proto: netpolicy.ProtoTCP, Ports: netpolicy.PortRange{From: 8080, To: 9000}})
	if err := n.fw.Apply(ctx, third.owner, bad); err == nil {
		t.Error("the kernel took overlapping allow elements")
		_ = n.fw.Remove(ctx, third.owner)
	} else {
		t.Logf("refused as expected: %v", err)
	}
	if after := ruleset(t); after != before {
		t.Errorf("a failed Apply changed the ruleset:\nbefore %s\nafter  %s", before, after)
	}
	if !sb.canConnect(8080) {
		t.Error("the link's owner lost its policy")
	}
}

// TestKernelIPv4InIPv6Refused: with an IPv6 pool behind a NAT64 (or 6to4)
// path, a guest in open mode must not reach the metadata service as
// 64:ff9b::a9fe:a9fe or 2002:a9fe:a9fe::1. The server netns holds those
// addresses (it plays the translator's far side); a rule naming one
// opens it, which shows the route works and the refusal is the policy's.
func TestKernelIPv4InIPv6Refused(t *testing.T) {
	n := newNode(t)
	nat64 := netip.MustParseAddr("64:ff9b::a9fe:a9fe")    // 169.254.169.254 through NAT64
	sixToFour := netip.MustParseAddr("2002:a9fe:a9fe::1") // 169.254.169.254 through 6to4
	for _, a := range []netip.Addr{nat64, sixToFour} {
		addAddr6(t, n.server.Handle, "eth0", netip.PrefixFrom(a, 128))
		n.tcpEcho(n.server.Do, netip.AddrPortFrom(a, 8080).String())
	}
	n.tcpEcho(n.server.Do, netip.AddrPortFrom(serverAddr6, 8080).String())
	srv, err := netlink.LinkByName("kt-srv0")
	if err != nil {
		t.Fatal(err)
	}
	for _, dst := range []string{"64:ff9b::/96", "2002::/16"} {
		_, ipn, _ := net.ParseCIDR(dst)
		r := &netlink.Route{LinkIndex: srv.Attrs().Index, Dst: ipn, Gw: net.IP(serverAddr6.AsSlice())}
		if err := netlink.RouteAdd(r); err != nil {
			t.Fatalf("route %s: %v", dst, err)
		}
		t.Cleanup(func() { _ = netlink.RouteDel(r) })
	}
	sb := n.applied(14, policy(t, netpolicy.ModeOpen))
	if !sb.canConnectTo(netip.AddrPortFrom(serverAddr6, 8080)) {
		t.Fatal("open mode does not reach a public v6 address")
	}
	for _, a := range []netip.Addr{nat64, sixToFour} {
		if sb.canConnectTo(netip.AddrPortFrom(a, 8080)) {
			t.Errorf("open mode reached %v (metadata inside IPv6)", a)
		}
	}
	// Named explicitly, like any reserved range: reachable.
	sb.apply(policy(t, netpolicy.ModeOpen, cidr(nat64.String()+"/128", "tcp", "8080")))
	if !sb.canConnectTo(netip.AddrPortFrom(nat64, 8080)) {
		t.Errorf("a rule naming %v does not open it", nat64)
	}
	if sb.canConnectTo(netip.AddrPortFrom(sixToFour, 8080)) {
		t.Errorf("a rule naming %v opened %v", nat64, sixToFour)
	}
}
