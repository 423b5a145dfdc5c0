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

type netProbe struct {
	proto string // "tcp" or "udp"
	dst   netip.Addr
	port  uint16
}

func (p netProbe) String() string { return fmt.Sprintf("%s %v %d", p.proto, p.dst, p.port) }

func tcpTo(a netip.Addr, port uint16) netProbe { return netProbe{"tcp", a, port} }
func udpTo(a netip.Addr, port uint16) netProbe { return netProbe{"udp", a, port} }

// probeFrom tries every probe from inside sandbox id at once (blocked ones
// wait out their timeout together) and says which got through: a TCP
// probe if the test host's echo came back, a UDP probe if the host
// received the datagram (busybox has no UDP netcat; tftp sends one).
func (e *env) probeFrom(cx context.Context, id string, host *ktest.TestHost, probes []netProbe) map[netProbe]bool {
	t := e.t
	t.Helper()
	var script strings.Builder
	script.WriteString(`t() { echo "tcp $1 $2: $(echo hi | nc -w 3 $1 $2 2>&1 | head -1)"; }
u() { timeout 3 tftp -g -r probe -l /dev/null $1 $2 >/dev/null 2>&1; echo "udp $1 $2: sent"; }
`)
	for _, p := range probes {
		fmt.Fprintf(&script, "%s %s %d &\n", p.proto[:1], p.dst, p.port)
	}
	script.WriteString("wait\n")
	before := len(host.Hits())
	r, err := e.client().Exec(cx, id, api.ExecRequest{Args: []string{"/bin/sh", "-c", script.String()}})
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("probes in %s: %+v, %v", id, r, err)
	}
	t.Logf("probes from %s:\n%s", id, r.Stdout)
	udpHits := map[netip.AddrPort]bool{}
	for _, h := range host.Hits()[before:] {
		if h.Proto == "udp" {
			udpHits[h.Local] = true
		}
	}
	got := map[netProbe]bool{}
	for _, line := range strings.Split(string(r.Stdout), "\n") {
		for _, p := range probes {
			if !strings.HasPrefix(line, p.String()+":") {
				continue
			}
			if p.proto == "tcp" {
				got[p] = strings.Contains(line, "hi from ")
			} else {
				got[p] = udpHits[netip.AddrPortFrom(p.dst, p.port)]
			}
		}
	}
	for _, p := range probes {
		if _, ok := got[p]; !ok {
			t.Fatalf("probe %v from %s: no result in the output:\n%s", p, id, r.Stdout)
		}
	}
	return got
}

// expectReach fails for each probe whose outcome is not the wanted one.
func (e *env) expectReach(cx context.Context, id string, host *ktest.TestHost, reach, blocked []netProbe) {
	e.t.Helper()
	got := e.probeFrom(cx, id, host, slices.Concat(reach, blocked))
	for _, p := range reach {
		if !got[p] {
			e.t.Errorf("%s: %v is blocked, want it reachable", id, p)
		}
	}
	for _, p := range blocked {
		if got[p] {
			e.t.Errorf("%s: %v got through, want it blocked", id, p)
		}
	}
}

// guestGateway is the sandbox's default gateway (the node's end of its
// veth), read inside the guest.
func (e *env) guestGateway(cx context.Context, id string) netip.Addr {
	e.t.Helper()
	r, err := e.client().Exec(cx, id, api.ExecRequest{Args: []string{"/bin/sh", "-c", "ip -4 route show default"}})
	if err != nil || r.ExitCode != 0 {
		e.t.Fatalf("guest routes of %s: %+v, %v", id, r, err)
	}
	m := regexp.MustCompile(`default via (\S+)`).FindSubmatch(r.Stdout)
	if m == nil {
		e.t.Fatalf("guest %s has no default route: %q", id, r.Stdout)
	}
	gw, err := netip.ParseAddr(string(m[1]))
	if err != nil {
		e.t.Fatal(err)
	}
	return gw
}

// uplinkAddr is an IPv4 address of the VM's own uplink (not loopback, a
// sandbox link or a test host's link), if it has one.
func uplinkAddr(t *testing.T) (netip.Addr, bool) {
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range ifs {
		if i.Flags&net.FlagLoopback != 0 || strings.HasPrefix(i.Name, "ctl-") || strings.HasPrefix(i.Name, "kth") {
			continue
		}
		as, _ := i.Addrs()
		for _, a := range as {
			if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() {
				return p.Addr(), true
			}
		}
	}
	return netip.Addr{}, false
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

// TestNetworkPolicyEnforced: a restricted sandbox reaches exactly its CIDR
// rule's port and protocol on a test host, and not the host's other port,
// other address, UDP, the metadata address or any of the node's own
// addresses; a deny_all sandbox reaches nothing; the counters move.
func TestNetworkPolicyEnforced(t *testing.T) {
	e := newEnv(t)
	host := ktest.NewTestHost(t, ktest.TestHostOptions{})
	meta := netip.MustParseAddr("169.254.169.254")
	host.AddAddr(t, meta)
	listenOnNode(t)
	e.start("a")
	e.waitPrimary("a", 60*time.Second)
	c := e.client()
	cx := ctx(t, 6*time.Minute)

	// Positive controls: the node reaches every destination below itself.
	nodeAddrs := []netip.Addr{host.Gateway4}
	if a, ok := uplinkAddr(t); ok {
		nodeAddrs = append(nodeAddrs, a)
	}
	for _, a := range []netip.AddrPort{
		netip.AddrPortFrom(host.Addr4, 8080), netip.AddrPortFrom(host.Addr4, 8081), netip.AddrPortFrom(host.Other4, 8080),
		netip.AddrPortFrom(meta, 8080), netip.AddrPortFrom(nodeAddrs[len(nodeAddrs)-1], e2eNodePort),
	} {
		conn, err := net.DialTimeout("tcp", a.String(), 3*time.Second)
		if err != nil {
			t.Fatalf("the node itself cannot reach %v: %v", a, err)
		}
		conn.Close()
	}

	// The probes run side by side: with the ptrace platform each guest
	// process costs host tasks, beyond claimReq's 128 pids (the first
	// run's probes ended in "WaitPID failed: EOF").
	withRoom := func(r api.ClaimRequest) api.ClaimRequest {
		r.Resources.PIDs, r.Resources.MemoryBytes = 1024, 512<<20
		return r
	}
	req := withRoom(claimReq("claim-net-r", 1))
	req.Network = api.NetworkPolicy{Mode: api.NetworkRestrict, Rules: []api.NetworkRule{
		{CIDR: host.Addr4.String() + "/32", Protocol: "tcp", Ports: []string{"8080"}},
		{CIDR: host.Other4.String(), Protocol: "udp", Ports: []string{"5354"}},
	}}
	if _, err := c.Claim(cx, "net-r", req); err != nil {
		t.Fatalf("claim restricted: %v", err)
	}
	req = withRoom(claimReq("claim-net-d", 1))
	if _, err := c.Claim(cx, "net-d", req); err != nil {
		t.Fatalf("claim deny_all: %v", err)
	}

	gw := e.guestGateway(cx, "net-r")
	blockedNode := []netProbe{tcpTo(gw, e2eNodePort)}
	for _, a := range nodeAddrs {
		blockedNode = append(blockedNode, tcpTo(a, e2eNodePort))
	}
	e.expectReach(cx, "net-r", host,
		[]netProbe{tcpTo(host.Addr4, 8080), udpTo(host.Other4, 5354)},
		slices.Concat([]netProbe{
			tcpTo(host.Addr4, 8081), tcpTo(host.Other4, 8080), // other port, other address
			udpTo(host.Addr4, 5353), udpTo(host.Other4, 5353), // UDP where only TCP (or another port) is allowed
			tcpTo(meta, 8080), udpTo(meta, 5353), // metadata
		}, blockedNode))

	gwd := e.guestGateway(cx, "net-d")
	e.expectReach(cx, "net-d", host, nil, []netProbe{
		tcpTo(host.Addr4, 8080), tcpTo(host.Other4, 8081), udpTo(host.Addr4, 5353), udpTo(host.Other4, 5354),
		tcpTo(meta, 8080), tcpTo(gwd, e2eNodePort), tcpTo(host.Gateway4, e2eNodePort),
	})

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
