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
	"github.com/ctld/ctld/internal/testutil"
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
	ktest.GreetTCP(t, e2eNodePort, "hi from the node\n")
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
	var out []netip.Addr
	for _, a := range ktest.LinkAddrs(t) {
		if a.IsGlobalUnicast() {
			out = append(out, a)
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

// lastNumbered is the highest n of the lines "<prefix><n>..." in text.
func lastNumbered(text, prefix string) int {
	last := 0
	for _, l := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(l, prefix); ok {
			var n int
			if _, err := fmt.Sscanf(rest, "%d", &n); err == nil && n > last {
				last = n
			}
		}
	}
	return last
}

// hostLast is the highest n of the lines "<prefix><n>" the test host
// received on dst.
func hostLast(h *ktest.TestHost, dst netip.AddrPort, prefix string) int {
	var text strings.Builder
	for _, l := range h.Lines() {
		if l.Local == dst {
			text.WriteString(l.Text + "\n")
		}
	}
	return lastNumbered(text.String(), prefix)
}

// waitFor polls cond until it holds or d passes; what says what was
// waited for, state what there was instead.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool, state func() string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s; instead: %s", d, what, state())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestNetworkLiveUpdateOpenConnections: a runsc guest holds two TCP
// connections open, each sending a numbered line a second that the test
// host echoes; a live update removes one destination. The connection to
// the destination that stays allowed lives on (same conntrack flow, it
// keeps echoing); the other is cut: its conntrack flow is deleted and the
// host receives nothing more on it while the guest keeps sending.
func TestNetworkLiveUpdateOpenConnections(t *testing.T) {
	e := newEnv(t)
	host := ktest.NewTestHost(t, ktest.TestHostOptions{})
	e.start("a")
	e.waitPrimary("a", 2*time.Minute) // a starved CI VM took 50 s
	c := e.client()
	cx := ctx(t, 10*time.Minute)
	start := time.Now()

	keepDst, cutDst := netip.AddrPortFrom(host.Addr4, 8080), netip.AddrPortFrom(host.Other4, 8080)
	rule := func(a netip.AddrPort) api.NetworkRule {
		return api.NetworkRule{CIDR: a.Addr().String() + "/32", Protocol: "tcp", Ports: []string{fmt.Sprint(a.Port())}}
	}
	req := withNetRoom(claimReq("claim-net-u", 1))
	req.Network = api.NetworkPolicy{Mode: api.NetworkRestrict, Rules: []api.NetworkRule{rule(keepDst), rule(cutDst)}}
	if _, err := c.Claim(cx, "net-u", req); err != nil {
		t.Fatalf("claim: %v", err)
	}
	g := e.guestNetOf(cx, "net-u")
	claimed := time.Now()

	// Two connections, one line a second each, for at most 3 minutes.
	conn := func(prefix string, dst netip.AddrPort) string {
		return fmt.Sprintf("(i=0; while [ $i -lt 180 ]; do i=$((i+1)); echo %s$i; sleep 1; done) | nc %s %d &\n", prefix, dst.Addr(), dst.Port())
	}
	var out testutil.Buffer
	scx, stop := context.WithCancel(cx)
	streamDone := make(chan error, 1)
	go func() {
		_, err := c.ExecStream(scx, "net-u", api.ExecRequest{Args: []string{"/bin/sh", "-c", conn("keep", keepDst) + conn("cut", cutDst) + "wait\n"}}, &out, &out)
		streamDone <- err
	}()
	streamOpen := true
	endStream := func() {
		if streamOpen {
			streamOpen = false
			stop()
			<-streamDone
		}
	}
	defer endStream()
	state := func() string {
		return fmt.Sprintf("guest output %q; host lines %v", out.String(), host.Lines())
	}
	waitFor(t, 3*time.Minute, "both connections to echo a line", func() bool {
		return lastNumbered(out.String(), "keep") > 0 && lastNumbered(out.String(), "cut") > 0
	}, state)
	flowOf := func(dst netip.AddrPort) (ktest.Flow, bool) {
		fs, err := ktest.ConfirmedFlows()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fs {
			if f.Proto == "tcp" && f.Dst == dst && slices.Contains(g.Addrs, f.Src.Addr()) {
				return f, true
			}
		}
		return ktest.Flow{}, false
	}
	keepFlow, ok := flowOf(keepDst)
	if _, ok2 := flowOf(cutDst); !ok || !ok2 {
		t.Fatalf("before the update: no conntrack flow to %v (%v) or %v (%v)", keepDst, ok, cutDst, ok2)
	}

	update := time.Now()
	if _, err := c.UpdateNetwork(cx, "net-u", api.NetworkPolicy{Mode: api.NetworkRestrict, Rules: []api.NetworkRule{rule(keepDst)}}); err != nil {
		t.Fatalf("update: %v", err)
	}
	updated := time.Now()
	// What had arrived when the update returned: the host reads its
	// sockets at once; one more line may be in its socket's buffer.
	keepAt, cutAt := hostLast(host, keepDst, "keep"), hostLast(host, cutDst, "cut")
	if f, ok := flowOf(cutDst); ok {
		t.Errorf("after the update the flow %v -> %v is still in conntrack: want it deleted", f.Src, f.Dst)
	}
	if f, ok := flowOf(keepDst); !ok || f != keepFlow {
		t.Errorf("after the update the kept connection's flow is %v (%v), want %v", f, ok, keepFlow)
	}
	// The kept connection goes on: three more lines reach the host and
	// echo back to the guest (without the cut, as many would reach the
	// host on the other connection).
	echoedAt := lastNumbered(out.String(), "keep")
	waitFor(t, 3*time.Minute, "three more lines on the kept connection", func() bool {
		return hostLast(host, keepDst, "keep") >= keepAt+3 && lastNumbered(out.String(), "keep") >= echoedAt+3
	}, state)
	// Meanwhile the guest went on sending on the other connection (its
	// writer knows nothing of the update), and none of it arrived.
	if got := hostLast(host, cutDst, "cut"); got > cutAt+1 {
		t.Errorf("the host received line cut%d on the removed destination %v after the update (cut%d had arrived when it returned)", got, cutDst, cutAt)
	}
	if _, ok := flowOf(cutDst); ok {
		t.Errorf("a flow to the removed %v was confirmed after the update", cutDst)
	}
	t.Logf("guest seconds: claim %.1fs, connections up %.1fs, update %.2fs, kept connection +3 lines %.1fs; host lines at the update keep%d cut%d, now keep%d cut%d",
		claimed.Sub(start).Seconds(), update.Sub(claimed).Seconds(), updated.Sub(update).Seconds(), time.Since(updated).Seconds(),
		keepAt, cutAt, hostLast(host, keepDst, "keep"), hostLast(host, cutDst, "cut"))

	endStream()
	rel, err := c.Release(cx, "net-u", api.ReleaseRequest{OperationID: "release-net-u", Generation: 1})
	if err != nil {
		t.Fatalf("release: %v", err)
	}
	if !rel.Proof.Clean {
		t.Errorf("proof not clean: %+v", rel.Proof.Checks)
	}
}
