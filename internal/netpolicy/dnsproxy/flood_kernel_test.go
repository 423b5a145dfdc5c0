package dnsproxy

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/netpolicy"
)

// TestKernelProxyBoundsAndUplinkSpoof: the proxy's bounds with the real
// firewall, from a real sandbox netns, and a spoofer on the uplink side.
//
//  1. A peer on an uplink-side link (not a sandbox link) sends a query
//     to the proxy's port from the sandbox's pool address: the packet
//     reaches the node (a plain socket there gets it), but the proxy
//     never serves it (the upstream never sees the name, the sandbox's
//     set gets nothing, the peer gets no answer).
//  2. Names under the allowed wildcard, each answering 32 new
//     addresses, fill the domain set to its size (the kernel's bound;
//     the proxy's own cap is set higher here so the kernel is what
//     holds): past it the proxy answers SERVFAIL and the set stays at
//     its size; an address already in the full set is still refreshed.
//  3. A flood of random names under the wildcard beyond the sandbox's
//     query rate is answered REFUSED, and the set still holds its size.
func TestKernelProxyBoundsAndUplinkSpoof(t *testing.T) {
	ktest.Require(t)
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
	ktest.Forwarding(t)

	const setSize = 64
	up := startUpstream(t)
	up.mu.Lock()
	for i := range 8 {
		var rrs []string
		for j := range MaxAddrs {
			rrs = append(rrs, fmt.Sprintf("r%d.flood.example.com. 300 IN A 11.%d.0.%d", i, i, j+1))
		}
		up.zone[fmt.Sprintf("r%d.flood.example.com. A", i)] = rrs
	}
	up.zone["spoof.example.com. A"] = []string{"spoof.example.com. 300 IN A 11.99.0.1"}
	up.mu.Unlock()

	const rate, burst, port = 5, 10, 10054
	r := newSandboxRig(t, ctx, log, up.addr, rigConfig{
		table: "ctldtest_flood", port: port, setSize: setSize, slot: 3, id: "kt-flood",
		pool:  netpolicy.Pool{V4: netip.MustParsePrefix("10.233.0.0/24")},
		rules: []netpolicy.RuleSpec{{Domain: "*.example.com", Protocol: "tcp", Ports: []string{"443"}}},
		proxy: Config{QueryRate: rate, QueryBurst: burst, MaxAddrsPerSandbox: 4 * setSize},
	})
	b, o, ns, fw := r.b, r.o, r.ns, r.fw

	elements := func() int { return len(r.domainSet(t, false)) }
	query := func(name string) (*dns.Msg, error) {
		var r *dns.Msg
		err := ns.Do(func() (err error) {
			m := new(dns.Msg)
			m.SetQuestion(name, dns.TypeA)
			m.SetEdns0(EDNSSize, false)
			c := dns.Client{Net: "udp", Timeout: 3 * time.Second}
			r, _, err = c.Exchange(m, netip.AddrPortFrom(b.Gateway4, 53).String())
			return err
		})
		return r, err
	}

	// 1. The spoofer on the uplink's segment.
	peer := ktest.NewNetns(t)
	nodeSide, peerSide := netip.MustParseAddr("192.0.2.65"), netip.MustParseAddr("192.0.2.66")
	ktest.VethPair(t, ktest.Veth{Netns: netns.None(), Name: "kt-up0", Addr: nodeSide.String() + "/30"},
		ktest.Veth{Netns: peer.Handle, Name: "eth0", Addr: peerSide.String() + "/30"})
	// Loose or no reverse-path filter on the uplink, as on a router: the
	// pool is routable from the node, so only the firewall decides.
	if err := os.WriteFile("/proc/sys/net/ipv4/conf/kt-up0/rp_filter", []byte("0"), 0o644); err != nil {
		t.Fatal(err)
	}
	h, err := netlink.NewHandleAt(peer.Handle)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	l, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: b.Addr4.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
		t.Fatal(err)
	}
	spoofed := func(dst netip.AddrPort, payload []byte) []byte {
		t.Helper()
		var got []byte
		if err := peer.Do(func() error {
			c, err := net.DialUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(b.Addr4, 0)), net.UDPAddrFromAddrPort(dst))
			if err != nil {
				return err
			}
			defer c.Close()
			for range 3 {
				if _, err := c.Write(payload); err != nil {
					return err
				}
				buf := make([]byte, 1500)
				_ = c.SetReadDeadline(time.Now().Add(time.Second))
				if n, err := c.Read(buf); err == nil {
					got = buf[:n]
					return nil
				}
			}
			return nil
		}); err != nil {
			t.Fatalf("send from the peer: %v", err)
		}
		return got
	}
	// Sanity: a spoofed datagram from the peer reaches a socket of the node.
	sink, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(nodeSide, 10055)))
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	spoofed(netip.AddrPortFrom(nodeSide, 10055), []byte("hello"))
	buf := make([]byte, 64)
	_ = sink.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, from, err := sink.ReadFromUDPAddrPort(buf)
	if err != nil || string(buf[:n]) != "hello" || from.Addr() != b.Addr4 {
		t.Fatalf("the spoofed datagram did not reach the node from %v: %q from %v, %v", b.Addr4, buf[:n], from, err)
	}
	m := new(dns.Msg)
	m.SetQuestion("spoof.example.com.", dns.TypeA)
	wire, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	if ans := spoofed(netip.AddrPortFrom(nodeSide, port), wire); ans != nil {
		t.Errorf("the spoofer on the uplink got an answer from the proxy (%d bytes)", len(ans))
	}
	for _, q := range up.queries() {
		if strings.Contains(q, "spoof.example.com.") {
			t.Errorf("the proxy served the uplink spoofer as the sandbox: the upstream saw %q", q)
		}
	}
	if n := elements(); n != 0 {
		t.Errorf("the spoofed query put %d elements into the sandbox's set", n)
	}

	// 2. Fill the set to its size: two answers of 32 new addresses.
	var rcodes []string
	for i := range 4 {
		r, err := query(fmt.Sprintf("r%d.flood.example.com.", i))
		if err != nil {
			t.Fatalf("r%d: %v", i, err)
		}
		rcodes = append(rcodes, dns.RcodeToString[r.Rcode])
	}
	checkList(t, "rcodes filling the set", rcodes, []string{"NOERROR", "NOERROR", "SERVFAIL", "SERVFAIL"})
	if n := elements(); n != setSize {
		t.Errorf("the domain set holds %d elements, want its size %d", n, setSize)
	}
	// An address already in the full set is refreshed, a new one is not added.
	if err := fw.AllowResolved(ctx, o, 0, []netip.Addr{netip.MustParseAddr("11.0.0.1")}, time.Minute); err != nil {
		t.Errorf("refresh an element of the full set: %v", err)
	}
	if err := fw.AllowResolved(ctx, o, 0, []netip.Addr{netip.MustParseAddr("11.50.0.1")}, time.Minute); err == nil || !strings.Contains(err.Error(), "domain set is full (size 64)") {
		t.Errorf("an element past the set's size: %v, want the set full", err)
	}

	// 3. A flood of random names: beyond the rate, REFUSED.
	time.Sleep(time.Second * burst / rate) // a full bucket again
	counts := map[string]int{}
	start := time.Now()
	const flood = 150
	for i := range flood {
		r, err := query(fmt.Sprintf("x%d-%d.flood.example.com.", time.Now().UnixNano()%1e6, i))
		if err != nil {
			counts["error"]++
			continue
		}
		key := dns.RcodeToString[r.Rcode]
		if opt := r.IsEdns0(); opt != nil {
			for _, o := range opt.Option {
				if e, ok := o.(*dns.EDNS0_EDE); ok && strings.Contains(e.ExtraText, RateLimitedText) {
					key += " rate"
				}
			}
		}
		counts[key]++
	}
	elapsed := time.Since(start)
	served := counts["NXDOMAIN"]
	maxServed := burst + int(elapsed.Seconds()*rate) + 1
	t.Logf("flood of %d random names in %v: %v (at most %d served)", flood, elapsed, counts, maxServed)
	if counts["REFUSED rate"] == 0 || served > maxServed || served+counts["REFUSED rate"] != flood {
		t.Errorf("flood of %d in %v: %v; want at most %d answered (burst %d + %d/s), the rest REFUSED for the rate", flood, elapsed, counts, maxServed, burst, rate)
	}
	if n := elements(); n != setSize {
		t.Errorf("after the flood the domain set holds %d elements, want its size %d", n, setSize)
	}
}
