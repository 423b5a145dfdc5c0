package dnsproxy

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/netpolicy"
)

// TestKernelProxyThroughRedirect: the whole path in the VM. A sandbox
// netns (real Links) asks its gateway's port 53; the real firewall's
// redirect takes the query to the proxy; the proxy asks a fake upstream
// and puts the answer into the sandbox's domain set through the real
// Firewall, so the sandbox then connects to the answered address of a
// test host, and to nothing it was not answered.
func TestKernelProxyThroughRedirect(t *testing.T) {
	ktest.Require(t)
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))

	ktest.Forwarding(t)

	host := ktest.NewTestHost(t, ktest.TestHostOptions{})
	up := startUpstream(t)
	up.mu.Lock()
	up.zone["www.example.com. A"] = []string{fmt.Sprintf("www.example.com. 300 IN A %v", host.Addr4)}
	up.zone["rebind.example.com. A"] = []string{
		"rebind.example.com. 60 IN A 169.254.169.254",
		"rebind.example.com. 60 IN A 10.232.0.11", // slot 5: another sandbox
		fmt.Sprintf("rebind.example.com. 60 IN A %v", host.Other4),
	}
	up.zone["www.example.com. AAAA"] = []string{fmt.Sprintf("www.example.com. 300 IN AAAA %v", host.Addr6)}
	up.zone["rebind.example.com. AAAA"] = []string{
		"rebind.example.com. 60 IN AAAA fd00:ec2::254",
		"rebind.example.com. 60 IN AAAA fd00:c71d:d45::16", // slot 5: another sandbox
		fmt.Sprintf("rebind.example.com. 60 IN AAAA %v", host.Other6),
	}
	up.mu.Unlock()

	r := newSandboxRig(t, ctx, log, up.addr, rigConfig{
		table: "ctldtest_dns", port: 10053, slot: 4, id: "kt-dns",
		pool:  netpolicy.Pool{V4: netip.MustParsePrefix("10.232.0.0/24"), V6: netip.MustParsePrefix("fd00:c71d:d45::/64")},
		rules: []netpolicy.RuleSpec{{Domain: "*.example.com", Protocol: "tcp", Ports: []string{"8080"}}},
	})
	b, ns := r.b, r.ns

	// From inside the sandbox: DNS to its gateway's port 53, TCP to the
	// test host.
	// query asks the gateway of family gw (b.Gateway4 or b.Gateway6).
	query := func(network string, gw netip.Addr, name string, qtype uint16) string {
		t.Helper()
		var r *dns.Msg
		err := ns.Do(func() (err error) {
			m := new(dns.Msg)
			m.SetQuestion(name, qtype)
			m.SetEdns0(EDNSSize, false)
			c := dns.Client{Net: network, Timeout: 5 * time.Second}
			r, _, err = c.Exchange(m, netip.AddrPortFrom(gw, 53).String())
			return err
		})
		if err != nil {
			t.Fatalf("%s %s to %v from the sandbox: %v", network, name, gw, err)
		}
		return show(r)
	}
	connects := func(dst netip.Addr) bool {
		var c net.Conn
		err := ns.Do(func() (err error) {
			c, err = net.DialTimeout("tcp", netip.AddrPortFrom(dst, 8080).String(), 1500*time.Millisecond)
			return err
		})
		if err != nil {
			return false
		}
		c.Close()
		return true
	}
	// elements reads a domain set back: address → timeout.
	elements := func(v6 bool) []string {
		t.Helper()
		var out []string
		for _, e := range r.domainSet(t, v6) {
			a, _ := netip.AddrFromSlice(e.Key)
			out = append(out, fmt.Sprintf("%v timeout %v", a, e.Timeout))
		}
		slices.Sort(out)
		return out
	}

	const ede17 = `ede 17 "ctld network policy: answers in denied ranges dropped"`
	for _, f := range []struct {
		name            string
		gw, addr, other netip.Addr
		qtype           uint16
	}{
		{"v4", b.Gateway4, host.Addr4, host.Other4, dns.TypeA},
		{"v6", b.Gateway6, host.Addr6, host.Other6, dns.TypeAAAA},
	} {
		v6, rr := f.qtype == dns.TypeAAAA, dns.TypeToString[f.qtype]
		if connects(f.addr) {
			t.Fatalf("%s: the sandbox reached the test host before resolving its name", f.name)
		}
		check(t, f.name+" udp www", query("udp", f.gw, "www.example.com.", f.qtype), fmt.Sprintf("NOERROR | www.example.com. 300 %s %v", rr, f.addr))
		checkList(t, f.name+" set after www", elements(v6), []string{fmt.Sprintf("%v timeout 5m30s", f.addr)})
		if !connects(f.addr) {
			t.Errorf("%s: the sandbox cannot reach the answered address", f.name)
		}
		if connects(f.other) {
			t.Errorf("%s: the sandbox reached an address no answer named", f.name)
		}

		check(t, f.name+" tcp rebind", query("tcp", f.gw, "rebind.example.com.", f.qtype),
			fmt.Sprintf(`NOERROR | rebind.example.com. 60 %s %v | %s`, rr, f.other, ede17))
		want := []string{fmt.Sprintf("%v timeout 5m30s", f.addr), fmt.Sprintf("%v timeout 1m30s", f.other)}
		slices.Sort(want)
		checkList(t, f.name+" set after rebind", elements(v6), want)
		if !connects(f.other) {
			t.Errorf("%s: the sandbox cannot reach the answered address after the rebind answer", f.name)
		}
		check(t, f.name+" refused", query("udp", f.gw, "evil.com.", f.qtype), "REFUSED | "+blockedEDE)
	}

	r.proxy.Unregister(b.Slot)
	check(t, "unregistered", query("udp", b.Gateway4, "www.example.com.", dns.TypeA), "REFUSED")
	check(t, "unregistered v6", query("udp", b.Gateway6, "www.example.com.", dns.TypeAAAA), "REFUSED")

	// The upstream saw only the allowed names, from the node.
	var names []string
	for _, q := range up.queries() {
		f := strings.Fields(q)
		names = append(names, f[1]+" "+f[2])
	}
	checkList(t, "upstream", names, []string{"www.example.com. A", "rebind.example.com. A", "www.example.com. AAAA", "rebind.example.com. AAAA"})
}
