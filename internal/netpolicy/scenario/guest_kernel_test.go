package scenario

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

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
		c, err := nftables.New()
		if err != nil {
			t.Error(err)
			return
		}
		c.DelTable(&nftables.Table{Name: nft.DefaultTable, Family: nftables.TableFamilyINet})
		if err := c.Flush(); err != nil {
			t.Errorf("delete table: %v", err)
		}
	})
	if err := fw.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", fmt.Sprintf(":%d", nodePort))
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
func nodeAddrs(t *testing.T) []netip.Addr {
	t.Helper()
	as, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	var out []netip.Addr
	for _, a := range as {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out
}

// guest is a running runsc guest with its links and firewall objects.
type guest struct {
	n   *node
	id  string
	o   netpolicy.Owner
	eff netpolicy.Effective
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
	return g
}

// probe is one connection attempt from the guest.
type probe struct {
	proto string // "tcp" or "udp"
	dst   netip.Addr
	port  uint16
}

func (p probe) String() string { return fmt.Sprintf("%s %v %d", p.proto, p.dst, p.port) }

// run tries every probe from inside the guest at once (blocked ones wait
// out their timeout together) and reports, per probe, whether it got
// through: a TCP probe if the echo came back, a UDP probe if the test
// host received the datagram (busybox has no UDP netcat; tftp sends one
// datagram and the host records it).
func (g *guest) run(probes []probe) map[probe]bool {
	t := g.n.t
	t.Helper()
	var script strings.Builder
	script.WriteString(`t() { echo "tcp $1 $2: $(echo hi | nc -w 3 $1 $2 2>&1 | head -1)"; }
u() { timeout 3 tftp -g -r probe -l /dev/null $1 $2 >/dev/null 2>&1; echo "udp $1 $2: sent"; }
`)
	for _, p := range probes {
		fmt.Fprintf(&script, "%s %s %d &\n", p.proto[:1], p.dst, p.port)
	}
	script.WriteString("wait\n")
	before := len(g.n.host.Hits())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	code, err := g.n.rt.Exec(ctx, g.id, runsc.ExecProcess{Args: []string{"sh", "-c", script.String()}}, nil, &out, &out)
	if err != nil || code != 0 {
		t.Fatalf("probes in %s: exit %d, %v: %s", g.id, code, err, out.String())
	}
	t.Logf("probes from %s (%v):\n%s", g.id, g.o.Block.Addr4, out.String())
	udpHits := map[netip.AddrPort]bool{}
	for _, h := range g.n.host.Hits()[before:] {
		if h.Proto == "udp" {
			udpHits[h.Local] = true
		}
	}
	got := map[probe]bool{}
	for _, line := range strings.Split(out.String(), "\n") {
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
			t.Fatalf("probe %v from %s: no result in the output:\n%s", p, g.id, out.String())
		}
	}
	return got
}

// expect runs the probes and fails for each whose outcome is not the
// wanted one.
func (g *guest) expect(reach, blocked []probe) {
	t := g.n.t
	t.Helper()
	got := g.run(slices.Concat(reach, blocked))
	for _, p := range reach {
		if !got[p] {
			t.Errorf("%s (%s): %v is blocked, want it reachable", g.id, g.o.Block.Addr4, p)
		}
	}
	if t.Failed() {
		ct, _ := os.ReadFile("/proc/net/nf_conntrack")
		t.Logf("hits: %v\nconntrack:\n%s", g.n.host.Hits(), ct)
		out, _ := exec.Command("nft", "list", "table", "inet", nft.DefaultTable).CombinedOutput()
		t.Logf("effective: %+v\nnft list table inet %s:\n%s", g.eff, nft.DefaultTable, out)
	}
	for _, p := range blocked {
		if got[p] {
			t.Errorf("%s (%s): %v got through, want it blocked", g.id, g.o.Block.Addr4, p)
		}
	}
}

func tcp(a netip.Addr, port uint16) probe { return probe{"tcp", a, port} }
func udp(a netip.Addr, port uint16) probe { return probe{"udp", a, port} }

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
