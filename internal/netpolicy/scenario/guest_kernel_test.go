package scenario

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/netpolicy"
	"github.com/ctld/ctld/internal/netpolicy/nft"
	"github.com/ctld/ctld/internal/runsc"
	"github.com/ctld/ctld/internal/template"
)

var pool = netpolicy.Pool{V4: netip.MustParsePrefix("10.232.0.0/20"), V6: netip.MustParsePrefix("fd00:c71d:5ce::/64")}

// nodePort is a port the test (the node) listens on at every address, to
// prove that a sandbox reaches none of the node's addresses.
const nodePort = 9090

// node is the VM's root netns set up as ctld sets it up: forwarding on,
// the firewall's table ensured, plus a test host and a listener on the
// node itself.
type node struct {
	t     *testing.T
	links *netpolicy.Links
	fw    *nft.Firewall
	host  *ktest.TestHost
	rt    *runsc.Runtime
	tmp   string
}

func newNode(t *testing.T) *node {
	ktest.RequireBinary(t, "runsc")
	ktest.RequireBinary(t, "nft")
	n := &node{t: t, tmp: t.TempDir(), links: &netpolicy.Links{Logger: slog.New(slog.NewTextHandler(t.Output(), nil))}}
	n.rt = &runsc.Runtime{Root: filepath.Join(n.tmp, "runsc"), LogDir: filepath.Join(n.tmp, "logs")}
	n.rt.Version, _ = runsc.Version(context.Background(), "runsc") // the build on PATH (make RUNSC=...)
	ktest.CheckLeaks(t, ktest.SnapshotOptions{RunscRoots: []string{n.rt.Root}})
	before := ruleset(t)
	t.Cleanup(func() {
		if after := ruleset(t); after != before {
			t.Errorf("nft ruleset after the test differs from the baseline:\nbefore %s\nafter  %s", before, after)
		}
	})
	// Forwarding as the node turns it on; restored so the VM's other
	// tests see what they saw.
	for _, k := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
		old, err := os.ReadFile(k)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.WriteFile(k, old, 0o644) })
	}
	ctx := context.Background()
	if err := n.links.EnableForwarding(ctx, true); err != nil {
		t.Fatal(err)
	}
	n.host = ktest.NewTestHost(t, ktest.TestHostOptions{})
	n.host.AddAddr(t, netip.MustParseAddr("169.254.169.254"))

	fw, err := nft.New(nft.Config{DNSPort: 5300, Pool: pool}, slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err != nil {
		t.Fatal(err)
	}
	n.fw = fw
	t.Cleanup(func() {
		if err := ktest.DeleteNftTable(nft.DefaultTable); err != nil {
			t.Errorf("delete table: %v", err)
		}
	})
	if err := fw.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	ktest.GreetTCP(t, nodePort, "hi from the node\n")
	return n
}

func ruleset(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("nft", "-j", "list", "ruleset").Output()
	if err != nil {
		t.Fatalf("nft -j list ruleset: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// nodeAddrs are the addresses of the root netns's links, as the node
// passes them to Resolve.
func nodeAddrs(t *testing.T) []netip.Addr { return ktest.LinkAddrs(t) }

// guest is a running runsc guest with its links and firewall objects.
type guest struct {
	n      *node
	id     string
	o      netpolicy.Owner
	eff    netpolicy.Effective
	ns     ktest.Netns
	prober *ktest.Prober
}

// sandbox makes what a claim makes: netns, links, the policy applied,
// then a runsc guest. Cleanup removes all of it in release order.
func (n *node) sandbox(id string, slot netpolicy.Slot, spec netpolicy.Spec) *guest {
	t := n.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b, err := pool.Block(slot)
	if err != nil {
		t.Fatal(err)
	}
	g := &guest{n: n, id: id, o: netpolicy.Owner{ID: id, Generation: 1, Block: b}}
	pol, err := netpolicy.ParseDefault("network", spec)
	if err != nil {
		t.Fatal(err)
	}
	eff := netpolicy.Resolve(pol, netpolicy.Facts{Pool: pool, Block: b, NodeAddrs: nodeAddrs(t)})
	ns := ktest.NewNetns(t)
	g.ns = ns
	t.Cleanup(func() {
		if err := n.links.Remove(context.Background(), g.o.Link()); err != nil {
			t.Errorf("remove links of %s: %v", id, err)
		}
	})
	if err := n.links.Make(ctx, g.o, ns.Path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.fw.Remove(context.Background(), g.o); err != nil {
			t.Errorf("remove firewall objects of %s: %v", id, err)
		}
	})
	g.eff = eff
	if err := n.fw.Apply(ctx, g.o, eff); err != nil {
		t.Fatal(err)
	}
	rootfs, bundle := filepath.Join(n.tmp, id, "rootfs"), filepath.Join(n.tmp, id, "bundle")
	if err := template.BuildBusybox(rootfs, "/bin/busybox"); err != nil {
		t.Fatal(err)
	}
	s, err := runsc.BuildSpec(runsc.BundleSpec{ContainerID: id, RootPath: rootfs, Hostname: id, NetnsPath: ns.Path, Args: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := runsc.WriteBundle(bundle, s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
		defer dcancel()
		if err := n.rt.Delete(dctx, id); err != nil {
			t.Errorf("delete guest %s: %v", id, err)
		}
	})
	if err := n.rt.Create(ctx, id, bundle); err != nil {
		t.Fatal(err)
	}
	if err := n.rt.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	g.prober = &ktest.Prober{
		Exec: func(ctx context.Context, script string) (string, error) {
			var out bytes.Buffer
			code, err := n.rt.Exec(ctx, id, runsc.ExecProcess{Args: []string{"sh", "-c", script}}, nil, &out, &out)
			if err == nil && code != 0 {
				err = fmt.Errorf("exit %d", code)
			}
			return out.String(), err
		},
		Host:    n.host,
		Capture: ktest.NewCapture(t, g.o.Link()),
		Guest:   []netip.Addr{b.Addr4, b.Addr6},
	}
	return g
}

// probe is one connection attempt from the guest.
type probe = ktest.Probe

// expect runs the probes from the guest at once (ktest.Prober: reach must
// reach the test host; blocked must leave the guest and not pass the
// firewall) and checks that the guest's drop counter rose when a blocked
// probe went past the node (the node's own addresses are the input
// chain's, which has no counter of the guest's).
func (g *guest) expect(reach, blocked []probe) {
	t := g.n.t
	t.Helper()
	ctx := context.Background()
	c0, err := g.n.fw.Counters(ctx, g.o)
	if err != nil {
		t.Fatal(err)
	}
	g.prober.Expect(t, reach, blocked)
	c1, err := g.n.fw.Counters(ctx, g.o)
	if err != nil {
		t.Fatal(err)
	}
	local := nodeAddrs(t)
	for _, p := range blocked {
		if !slices.Contains(local, p.Dst) && c1.DroppedPackets == c0.DroppedPackets {
			t.Errorf("%s: %v blocked but the drop counter of %s stayed at %d", g.id, p, g.o.Chain(), c0.DroppedPackets)
			break
		}
	}
	if t.Failed() {
		ct, _ := os.ReadFile("/proc/net/nf_conntrack")
		t.Logf("conntrack:\n%s", ct)
		out, _ := exec.Command("nft", "list", "table", "inet", nft.DefaultTable).CombinedOutput()
		t.Logf("effective: %+v\nnft list table inet %s:\n%s", g.eff, nft.DefaultTable, out)
	}
}

func tcp(a netip.Addr, port uint16) probe { return ktest.TCPProbe(a, port) }
func udp(a netip.Addr, port uint16) probe { return ktest.UDPProbe(a, port) }

// TestKernelGuestPolicy: what a gVisor guest reaches through the links and
// the firewall in each mode. Each blocked destination is one a guest
// reaches without the policy (the positive controls: the same host on
// another port or protocol, the open guest, the test's own dials).
func TestKernelGuestPolicy(t *testing.T) {
	n := newNode(t)
	h := n.host
	meta := netip.MustParseAddr("169.254.169.254")

	// Positive controls from the node itself: every destination below is
	// served and routed.
	for _, a := range []netip.Addr{h.Addr4, h.Other4, h.Addr6, h.Other6, meta} {
		c, err := net.DialTimeout("tcp", netip.AddrPortFrom(a, 8080).String(), 3*time.Second)
		if err != nil {
			t.Fatalf("the node cannot reach %v:8080 itself: %v", a, err)
		}
		c.Close()
	}

	t.Run("restricted", func(t *testing.T) {
		g := n.sandbox("sc-restricted", 1, netpolicy.Spec{Mode: "restricted", Rules: []netpolicy.RuleSpec{
			{CIDR: h.Addr4.String() + "/32", Protocol: "tcp", Ports: []string{"8080"}},
			{CIDR: h.Addr6.String() + "/128", Protocol: "tcp", Ports: []string{"8080"}},
			{CIDR: h.Other4.String(), Protocol: "udp", Ports: []string{"5354"}},
			{CIDR: h.Other6.String(), Protocol: "udp", Ports: []string{"5354"}},
			{CIDR: "198.19.0.0/16", Protocol: "tcp", Ports: []string{"8081"}},
			{CIDR: "198.18.0.3/32", Protocol: "tcp", Ports: []string{"8081-8082"}},
		}})
		b := g.o.Block
		g.expect(
			[]probe{tcp(h.Addr4, 8080), tcp(h.Addr6, 8080), udp(h.Other4, 5354), tcp(h.Other4, 8081), tcp(h.Addr4, 8081)},
			[]probe{
				tcp(h.Other4, 8080), tcp(h.Other6, 8080), tcp(h.Addr6, 8081), // other ports and addresses
				udp(h.Addr4, 5353), udp(h.Other4, 5353), // UDP not allowed there
				tcp(meta, 8080),                                      // metadata
				tcp(b.Gateway4, nodePort), tcp(b.Gateway6, nodePort), // the node, at its gateway
				tcp(h.Gateway4, nodePort), tcp(h.Gateway6, nodePort), // the node, at another address
			})
		c, err := n.fw.Counters(context.Background(), g.o)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("counters of %s: %+v", g.o.Chain(), c)
		if c.TxPackets == 0 || c.TxBytes == 0 || c.DroppedPackets == 0 {
			t.Errorf("counters %+v: want sent and dropped packets", c)
		}

		// Spoofing: a sandbox sends only from its own address, even to a
		// destination its policy allows.
		other, err := pool.Block(99) // a sandbox that could be there
		if err != nil {
			t.Fatal(err)
		}
		g.expectSpoofBlocked(b.Addr4, netip.AddrPortFrom(h.Other4, 5354), []netip.Addr{other.Addr4, b.Gateway4, h.Addr4, netip.MustParseAddr("203.0.113.9")})
		g.expectSpoofBlocked(b.Addr6, netip.AddrPortFrom(h.Other6, 5354), []netip.Addr{other.Addr6, b.Gateway6, h.Addr6, netip.MustParseAddr("2001:db8:ffff::9")})
	})

	t.Run("open", func(t *testing.T) {
		g := n.sandbox("sc-open", 2, netpolicy.Spec{Mode: "open"})
		b := g.o.Block
		g.expect(
			[]probe{tcp(h.Addr4, 8081), tcp(h.Other4, 8080), tcp(h.Other6, 8081), udp(h.Addr4, 5353)},
			[]probe{
				tcp(meta, 8080), udp(meta, 5353),
				tcp(b.Gateway4, nodePort), tcp(h.Gateway4, nodePort), tcp(h.Gateway6, nodePort),
			})
	})

	t.Run("deny_all", func(t *testing.T) {
		g := n.sandbox("sc-deny", 3, netpolicy.Spec{Mode: "deny_all"})
		b := g.o.Block
		g.expect(nil, []probe{
			tcp(h.Addr4, 8080), tcp(h.Addr6, 8080), tcp(h.Other4, 8081), udp(h.Addr4, 5353),
			tcp(meta, 8080), tcp(b.Gateway4, nodePort), tcp(h.Gateway4, nodePort),
		})
	})
}

// TestKernelGuestPolicyUnderLoad: a restricted guest's allowed probes get
// through, and its blocked ones are seen leaving it, while half the CPUs
// of the node are busy (a CI VM beside another one on two cores). With 3 s
// probe timeouts allowed probes failed so: nc's -w alarm and tftp's
// timeout fired before the slow guest finished its handshake or sent its
// datagram, though the firewall passed every packet.
func TestKernelGuestPolicyUnderLoad(t *testing.T) {
	n := newNode(t)
	h := n.host
	for range max(1, runtime.NumCPU()/2) {
		hog := exec.Command("sh", "-c", "while :; do :; done")
		if err := hog.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = hog.Process.Kill(); _ = hog.Wait() })
	}
	g := n.sandbox("sc-loaded", 1, netpolicy.Spec{Mode: "restricted", Rules: []netpolicy.RuleSpec{
		{CIDR: h.Addr4.String() + "/32", Protocol: "tcp", Ports: []string{"8080"}},
		{CIDR: h.Addr6.String() + "/128", Protocol: "tcp", Ports: []string{"8080"}},
		{CIDR: h.Other4.String(), Protocol: "udp", Ports: []string{"5354"}},
	}})
	b := g.o.Block
	g.expect(
		[]probe{tcp(h.Addr4, 8080), tcp(h.Addr6, 8080), udp(h.Other4, 5354)},
		[]probe{
			tcp(h.Other4, 8080), tcp(h.Other6, 8080), tcp(h.Addr6, 8081), tcp(h.Addr4, 8081),
			udp(h.Addr4, 5353), udp(h.Other4, 5353), tcp(netip.MustParseAddr("169.254.169.254"), 8080),
			tcp(b.Gateway4, nodePort), tcp(b.Gateway6, nodePort), tcp(h.Gateway4, nodePort), tcp(h.Gateway6, nodePort),
		})
}

// sendRawUDP sends one UDP datagram from src to dst out of eth0 of the
// guest's netns, through a packet socket of that netns. A runsc guest
// cannot do this itself (no CAP_NET_ADMIN or CAP_NET_RAW, runsc's
// netstack refuses raw sockets), so this stands in for a guest that
// could: the frame enters the node exactly as the guest's do.
func (g *guest) sendRawUDP(src, dst netip.AddrPort, payload string) {
	t := g.n.t
	t.Helper()
	host, err := net.InterfaceByName(g.o.Link())
	if err != nil {
		t.Fatal(err)
	}
	pkt, ethType := udpPacket(src, dst, []byte(payload))
	err = g.ns.Do(func() error {
		eth0, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		defer unix.Close(fd)
		to := &unix.SockaddrLinklayer{Ifindex: eth0.Index, Protocol: ethType<<8 | ethType>>8, Halen: 6}
		copy(to.Addr[:], host.HardwareAddr)
		return unix.Sendto(fd, pkt, 0, to)
	})
	if err != nil {
		t.Fatalf("send %v -> %v from the netns of %s: %v", src, dst, g.id, err)
	}
}

// udpPacket is an IPv4 or IPv6 packet of one UDP datagram, checksums
// filled, and its ethertype.
func udpPacket(src, dst netip.AddrPort, payload []byte) ([]byte, uint16) {
	u := make([]byte, 8+len(payload))
	binary.BigEndian.PutUint16(u[0:], src.Port())
	binary.BigEndian.PutUint16(u[2:], dst.Port())
	binary.BigEndian.PutUint16(u[4:], uint16(len(u)))
	copy(u[8:], payload)
	s, d := src.Addr().AsSlice(), dst.Addr().AsSlice()
	if src.Addr().Is4() {
		h := make([]byte, 20)
		h[0], h[8], h[9] = 0x45, 64, unix.IPPROTO_UDP
		binary.BigEndian.PutUint16(h[2:], uint16(20+len(u)))
		copy(h[12:], s)
		copy(h[16:], d)
		binary.BigEndian.PutUint16(h[10:], ^sum16(0, h))
		return append(h, u...), unix.ETH_P_IP // UDP checksum 0: none (IPv4)
	}
	h := make([]byte, 40)
	h[0], h[6], h[7] = 0x60, unix.IPPROTO_UDP, 64
	binary.BigEndian.PutUint16(h[4:], uint16(len(u)))
	copy(h[8:], s)
	copy(h[24:], d)
	pseudo := slices.Concat(s, d, []byte{0, 0, byte(len(u) >> 8), byte(len(u)), 0, 0, 0, unix.IPPROTO_UDP})
	c := ^sum16(sum16(0, pseudo), u)
	if c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(u[6:], c)
	return append(h, u...), unix.ETH_P_IPV6
}

// sum16 adds b to the ones' complement sum acc.
func sum16(acc uint16, b []byte) uint16 {
	s := uint32(acc)
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

// expectSpoofBlocked sends a UDP datagram to dst (a destination the
// guest's policy allows) from each of spoofs, then a control from the
// guest's own address own, all out of the guest's eth0 (sendRawUDP). The
// control must reach the test host, proving the frames are good and
// routed; each spoof must be seen on the veth and reach nothing: no hit
// on the host, no confirmed conntrack flow. The host's hits are in
// arrival order on one socket, so a spoof that got through would be there
// before the control. IPv6 spoofs are dropped by the chain's
// anti-spoofing rule (its drop counter rises); IPv4 ones already by the
// link's rp_filter, before any chain.
func (g *guest) expectSpoofBlocked(own netip.Addr, dst netip.AddrPort, spoofs []netip.Addr) {
	t := g.n.t
	t.Helper()
	ctx := context.Background()
	h, c := g.n.host, g.prober.Capture
	hits0, pkts0 := len(h.Hits()), len(c.Packets())
	ct0, err := g.n.fw.Counters(ctx, g.o)
	if err != nil {
		t.Fatal(err)
	}
	const spoofPort, controlPort = 40000, 40001
	for _, s := range spoofs {
		g.sendRawUDP(netip.AddrPortFrom(s, spoofPort), dst, "spoof")
	}
	g.sendRawUDP(netip.AddrPortFrom(own, controlPort), dst, "control")
	deadline := time.Now().Add(time.Minute)
	control := -1
	for control < 0 {
		for i, x := range h.Hits()[hits0:] {
			// The node masquerades the guest's address; the port stays.
			if x.Proto == "udp" && x.Local == dst && x.From.Port() == controlPort {
				control = i
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the control datagram %v -> %v never reached the test host (hits %v), so the spoofs' absence would prove nothing", g.id, own, dst, h.Hits()[hits0:])
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := h.Hits()[hits0:][:control]; len(got) > 0 {
		t.Errorf("%s: the test host received %v before the control: a spoofed datagram got through", g.id, got)
	}
	for _, s := range spoofs {
		seen := slices.ContainsFunc(c.Packets()[pkts0:], func(p ktest.Packet) bool {
			return p.In && p.Proto == "udp" && p.Src == netip.AddrPortFrom(s, spoofPort) && p.Dst == dst
		})
		if !seen {
			t.Errorf("%s: the datagram spoofed from %v was not seen on %s: its absence at the host proves nothing", g.id, s, c.Link)
		}
		if ok, err := ktest.FlowConfirmed("udp", s, dst); err != nil || ok {
			t.Errorf("%s: a conntrack flow from the spoofed %v to %v was confirmed (%v): it passed the firewall", g.id, s, dst, err)
		}
	}
	ct1, err := g.n.fw.Counters(ctx, g.o)
	if err != nil {
		t.Fatal(err)
	}
	if own.Is6() && ct1.DroppedPackets-ct0.DroppedPackets < uint64(len(spoofs)) {
		t.Errorf("%s: drop counter of %s rose %d -> %d for %d IPv6 spoofs", g.id, g.o.Chain(), ct0.DroppedPackets, ct1.DroppedPackets, len(spoofs))
	}
	t.Logf("%s: %d datagrams spoofed from %v to %v seen on %s and dropped; the control from %v reached the host; drops %d -> %d", g.id, len(spoofs), spoofs, dst, c.Link, own, ct0.DroppedPackets, ct1.DroppedPackets)
}
