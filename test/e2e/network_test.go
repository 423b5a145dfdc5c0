package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/ktest"
)

// The sandbox network end to end: claims through the real ctld, a gVisor
// guest per sandbox, a test host (ktest.TestHost) beyond the node as the
// destination. Every destination a test expects blocked is one the node
// itself reaches (checked first), so only the policy keeps the guest out.

// e2eNodePort is a port the test (on the node, in the root netns) listens
// on at every address: a guest must reach none of the node's addresses.
const e2eNodePort = 19090

// netProbe is one connection attempt from a guest (ktest.Probe).
type netProbe = ktest.Probe

func tcpTo(a netip.Addr, port uint16) netProbe { return ktest.TCPProbe(a, port) }
func udpTo(a netip.Addr, port uint16) netProbe { return ktest.UDPProbe(a, port) }

// guestNet is a sandbox's network as seen from both ends of its veth.
type guestNet struct {
	Link               string       // the host end, in the root netns
	Addrs              []netip.Addr // the guest's addresses on eth0
	Gateway4, Gateway6 netip.Addr   // the node's end (Gateway6 invalid without IPv6)
}

// guestNetOf reads sandbox id's addresses and gateways inside the guest
// and finds the host end of its veth by the gateway's address.
func (e *env) guestNetOf(cx context.Context, id string) guestNet {
	e.t.Helper()
	r, err := e.client().Exec(cx, id, api.ExecRequest{Args: []string{"/bin/sh", "-c", "ip -o addr show dev eth0; ip -4 route show default; ip -6 route show default"}})
	if err != nil || r.ExitCode != 0 {
		e.t.Fatalf("guest network of %s: %+v, %v", id, r, err)
	}
	var g guestNet
	for _, m := range regexp.MustCompile(`inet6? (\S+)/\d+ scope global`).FindAllSubmatch(r.Stdout, -1) {
		a, err := netip.ParseAddr(string(m[1]))
		if err != nil {
			e.t.Fatal(err)
		}
		if !a.IsLinkLocalUnicast() { // gVisor says "scope global" of its fe80 address
			g.Addrs = append(g.Addrs, a)
		}
	}
	for _, m := range regexp.MustCompile(`default via (\S+)`).FindAllSubmatch(r.Stdout, -1) {
		a, err := netip.ParseAddr(string(m[1]))
		if err != nil {
			e.t.Fatal(err)
		}
		if a.Is4() {
			g.Gateway4 = a
		} else {
			g.Gateway6 = a
		}
	}
	if len(g.Addrs) == 0 || !g.Gateway4.IsValid() {
		e.t.Fatalf("guest %s has no address or default route: %q", id, r.Stdout)
	}
	as, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, a := range as {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == g.Gateway4 {
			l, err := netlink.LinkByIndex(a.LinkIndex)
			if err != nil {
				e.t.Fatal(err)
			}
			g.Link = l.Attrs().Name
		}
	}
	if g.Link == "" {
		e.t.Fatalf("no link of the node holds %s's gateway %v", id, g.Gateway4)
	}
	return g
}

// prober runs probe rounds from sandbox id to host, through ctld's exec.
func (e *env) prober(cx context.Context, id string, host *ktest.TestHost) *ktest.Prober {
	e.t.Helper()
	g := e.guestNetOf(cx, id)
	return &ktest.Prober{
		Exec: func(ctx context.Context, script string) (string, error) {
			r, err := e.client().Exec(ctx, id, api.ExecRequest{Args: []string{"/bin/sh", "-c", script}})
			out := string(r.Stdout) + string(r.Stderr)
			if err == nil && r.ExitCode != 0 {
				err = fmt.Errorf("exit %d", r.ExitCode)
			}
			return out, err
		},
		Host:    host,
		Capture: ktest.NewCapture(e.t, g.Link),
		Guest:   g.Addrs,
	}
}

// expectReach runs the probes from sandbox id at once: each of reach must
// reach the test host, each of blocked must leave the guest and not pass
// the node's firewall (ktest.Prober.Expect).
func (e *env) expectReach(cx context.Context, id string, host *ktest.TestHost, reach, blocked []netProbe) {
	e.t.Helper()
	e.prober(cx, id, host).Expect(e.t, reach, blocked)
}

// listenOnNode serves e2eNodePort on every address of the root netns.
func listenOnNode(t *testing.T) {
	ln, err := net.Listen("tcp", fmt.Sprintf(":%d", e2eNodePort))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "hi from the node\n")
			c.Close()
		}
	}()
}

// withNetRoom gives a network test's guest room for its probes, which run
// side by side: with the ptrace platform each guest process costs host
// tasks, beyond claimReq's 128 pids (probes and a connection's writer
// loop ended in "urpc method containerManager.WaitPID failed: EOF").
func withNetRoom(r api.ClaimRequest) api.ClaimRequest {
	r.Resources.PIDs, r.Resources.MemoryBytes = 1024, 512<<20
	return r
}

// nodeAddrs are the global addresses of the node's links (root netns):
// its uplink, its end of every sandbox's veth, of every test host's.
func nodeAddrs(t *testing.T) []netip.Addr {
	t.Helper()
	as, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	var out []netip.Addr
	for _, a := range as {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap().IsGlobalUnicast() {
			out = append(out, ip.Unmap())
		}
	}
	return out
}

// expectNodeReaches proves that the node itself reaches each destination
// (a TCP connection, or a UDP datagram the test host records), so that
// only the policy keeps a guest from it.
func expectNodeReaches(t *testing.T, host *ktest.TestHost, probes []netProbe) {
	t.Helper()
	for _, p := range probes {
		dst := netip.AddrPortFrom(p.Dst, p.Port)
		if p.Proto == "tcp" {
			c, err := net.DialTimeout("tcp", dst.String(), 10*time.Second)
			if err != nil {
				t.Fatalf("the node itself cannot reach %v: %v", p, err)
			}
			c.Close()
			continue
		}
		before := len(host.Hits())
		c, err := net.Dial("udp", dst.String())
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for got := false; !got; {
			if time.Now().After(deadline) {
				t.Fatalf("the node itself cannot reach %v: no datagram arrived in 30s", p)
			}
			_, _ = c.Write([]byte("control\n"))
			time.Sleep(100 * time.Millisecond)
			for _, h := range host.Hits()[before:] {
				got = got || (h.Proto == "udp" && h.Local == dst)
			}
		}
		c.Close()
	}
}

// TestNetworkPolicyEnforced: from runsc guests through the real ctld, with
// IPv6 on. A restricted sandbox reaches exactly its rules (TCP on one
// port; TCP and UDP on a rule without ports), and none of the bypasses:
// another port or protocol of an allowed address, IPv6 to an address not
// allowed, a second resolver (udp/tcp 53 on an address a port-less rule
// allows), DoT (tcp 853), the metadata address, each of the node's
// addresses, another sandbox, UDP to a destination not allowed; it cannot
// take another source address. A deny_all sandbox reaches nothing. Every
// blocked probe is seen leaving its guest (ktest.Prober), every
// destination is one the node itself reaches, and the counters move.
func TestNetworkPolicyEnforced(t *testing.T) {
	e := newEnv(t)
	e.args = append(e.args, "--net-pool-v6", "fd00:c71d:e2e::/64")
	// The test host doubles as a second resolver (udp/tcp 53) and a DoT
	// server (tcp 853).
	host := ktest.NewTestHost(t, ktest.TestHostOptions{TCP: []uint16{8080, 8081, 53, 853}, UDP: []uint16{5353, 5354, 53}})
	meta := netip.MustParseAddr("169.254.169.254")
	host.AddAddr(t, meta)
	listenOnNode(t)
	e.start("a")
	e.waitPrimary("a", 2*time.Minute) // a starved CI VM took 50 s
	c := e.client()
	cx := ctx(t, 12*time.Minute) // a starved CI VM took 7 min

	req := withNetRoom(claimReq("claim-net-r", 1))
	req.Network = api.NetworkPolicy{Mode: api.NetworkRestrict, Rules: []api.NetworkRule{
		{CIDR: host.Addr4.String() + "/32", Protocol: "tcp", Ports: []string{"8080"}},
		{CIDR: host.Addr6.String() + "/128", Protocol: "tcp", Ports: []string{"8080"}},
		{CIDR: host.Other4.String() + "/32"}, // every port but DNS and DoT, TCP and UDP
	}}
	if _, err := c.Claim(cx, "net-r", req); err != nil {
		t.Fatalf("claim restricted: %v", err)
	}
	req = withNetRoom(claimReq("claim-net-d", 1))
	if _, err := c.Claim(cx, "net-d", req); err != nil {
		t.Fatalf("claim deny_all: %v", err)
	}
	rn, dn := e.guestNetOf(cx, "net-r"), e.guestNetOf(cx, "net-d")
	if len(rn.Addrs) != 2 || !rn.Gateway6.IsValid() {
		t.Fatalf("net-r's network %+v: want an IPv4 and an IPv6 address and gateway", rn)
	}

	var toNode []netProbe
	for _, a := range nodeAddrs(t) {
		toNode = append(toNode, tcpTo(a, e2eNodePort))
	}
	toOther := func(g guestNet) []netProbe {
		var out []netProbe
		for _, a := range g.Addrs {
			out = append(out, tcpTo(a, 8080), udpTo(a, 5353))
		}
		return out
	}
	// Positive controls: the node reaches every test host destination
	// below (a sandbox's own address is the node's neighbour: only the
	// policy stands between them).
	expectNodeReaches(t, host, []netProbe{
		tcpTo(host.Addr4, 8081), udpTo(host.Addr4, 5353), tcpTo(host.Addr6, 8081), tcpTo(host.Other6, 8080), udpTo(host.Other6, 5353),
		udpTo(host.Other4, 53), tcpTo(host.Other4, 53), tcpTo(host.Other4, 853), tcpTo(meta, 8080), udpTo(meta, 5353),
		toNode[0],
	})

	restrictedBlocked := slices.Concat([]netProbe{
		tcpTo(host.Addr4, 8081), udpTo(host.Addr4, 5353), // another port, another protocol of an allowed address
		tcpTo(host.Addr6, 8081), tcpTo(host.Other6, 8080), udpTo(host.Other6, 5353), // IPv6 not allowed
		udpTo(host.Other4, 53), tcpTo(host.Other4, 53), // a second resolver
		tcpTo(host.Other4, 853),              // DoT
		tcpTo(meta, 8080), udpTo(meta, 5353), // metadata
	}, toNode, toOther(dn))
	e.expectReach(cx, "net-r", host,
		[]netProbe{tcpTo(host.Addr4, 8080), tcpTo(host.Addr6, 8080), tcpTo(host.Other4, 8081), udpTo(host.Other4, 5354)},
		restrictedBlocked)

	e.expectReach(cx, "net-d", host, nil, slices.Concat([]netProbe{
		tcpTo(host.Addr4, 8080), tcpTo(host.Addr6, 8080), tcpTo(host.Other4, 8081), udpTo(host.Other4, 5354),
		udpTo(host.Other4, 53), tcpTo(host.Other4, 853), tcpTo(meta, 8080),
		tcpTo(dn.Gateway4, e2eNodePort), tcpTo(dn.Gateway6, e2eNodePort), tcpTo(host.Gateway4, e2eNodePort),
	}, toOther(rn)))

	// Spoofing from inside: a ctld guest holds no CAP_NET_ADMIN or
	// CAP_NET_RAW (and runsc's netstack refuses raw sockets), so it can
	// neither take another address nor write its own packets. That the
	// node drops spoofed packets anyway is proven with raw frames from a
	// sandbox's netns in the scenario kernel test
	// (internal/netpolicy/scenario, expectSpoofBlocked).
	spoof := "ip addr add 10.200.255.1/32 dev eth0 2>&1; echo rc=$?"
	r, err := c.Exec(cx, "net-r", api.ExecRequest{Args: []string{"/bin/sh", "-c", spoof}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(r.Stdout), "rc=") || strings.Contains(string(r.Stdout), "rc=0") {
		t.Errorf("net-r took another address (%q): want it refused", r.Stdout)
	}
	t.Logf("net-r: %s: %s", spoof, strings.TrimSpace(string(r.Stdout)))

	sb, err := c.Get(cx, "net-r")
	if err != nil {
		t.Fatal(err)
	}
	if sb.Network == nil || sb.Network.Mode != api.NetworkRestrict || sb.Network.TxPackets == 0 || sb.Network.DroppedPackets == 0 {
		t.Errorf("network status of net-r = %+v, want restricted with sent and dropped packets", sb.Network)
	}
	for _, id := range []string{"net-r", "net-d"} {
		rel, err := c.Release(cx, id, api.ReleaseRequest{OperationID: "release-" + id, Generation: 1})
		if err != nil {
			t.Fatalf("release %s: %v", id, err)
		}
		if !rel.Proof.Clean {
			t.Errorf("proof of %s not clean: %+v", id, rel.Proof.Checks)
		}
	}
}
