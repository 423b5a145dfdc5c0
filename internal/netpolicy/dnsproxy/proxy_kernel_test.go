package dnsproxy

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/miekg/dns"

	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/netpolicy"
	"github.com/ctld/ctld/internal/netpolicy/nft"
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

	const fwd = "/proc/sys/net/ipv4/ip_forward"
	old, err := os.ReadFile(fwd)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fwd, []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.WriteFile(fwd, old, 0o644) })

	host := ktest.NewTestHost(t, ktest.TestHostOptions{})
	up := startUpstream(t)
	up.mu.Lock()
	up.zone["www.example.com. A"] = []string{fmt.Sprintf("www.example.com. 300 IN A %v", host.Addr4)}
	up.zone["rebind.example.com. A"] = []string{
		"rebind.example.com. 60 IN A 169.254.169.254",
		"rebind.example.com. 60 IN A 10.232.0.11", // slot 5: another sandbox
		fmt.Sprintf("rebind.example.com. 60 IN A %v", host.Other4),
	}
	up.mu.Unlock()

	// A table of the test's own, so other packages' tests in the VM
	// (the nft package uses the default table) never meet it.
	pool := netpolicy.Pool{V4: netip.MustParsePrefix("10.232.0.0/24")}
	const port = 10053
	const table = "ctldtest_dns"
	fw, err := nft.New(nft.Config{Table: table, DNSPort: port, Pool: pool}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, err := nftables.New()
		if err != nil {
			t.Error(err)
			return
		}
		c.DelTable(&nftables.Table{Name: table, Family: nftables.TableFamilyINet})
		if err := c.Flush(); err != nil {
			t.Errorf("delete table: %v", err)
		}
	})
	if err := fw.Ensure(ctx); err != nil {
		t.Fatal(err)
	}

	b, err := pool.Block(4)
	if err != nil {
		t.Fatal(err)
	}
	o := netpolicy.Owner{ID: "kt-dns", Generation: 1, Block: b}
	ns := ktest.NewNetns(t)
	links := &netpolicy.Links{Logger: log}
	if err := links.Make(ctx, o, ns.Path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := links.Remove(ctx, o.Link()); err != nil {
			t.Errorf("remove links: %v", err)
		}
	})
	p, err := netpolicy.ParseDefault("network", netpolicy.Spec{Mode: "restricted", Rules: []netpolicy.RuleSpec{
		{Domain: "*.example.com", Protocol: "tcp", Ports: []string{"8080"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	eff := netpolicy.Resolve(p, netpolicy.Facts{Pool: pool, Block: b})
	if err := fw.Apply(ctx, o, eff); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := fw.Remove(ctx, o); err != nil {
			t.Errorf("firewall remove: %v", err)
		}
	})

	proxy, err := New(Config{Listen: fmt.Sprintf(":%d", port), Pool: pool, Upstreams: []string{up.addr}, Allower: fw, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := proxy.Listen(); err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- proxy.Serve(sctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	proxy.Register(o, eff)

	// From inside the sandbox: DNS to its gateway's port 53, TCP to the
	// test host.
	query := func(network, name string) string {
		t.Helper()
		var r *dns.Msg
		err := ns.Do(func() (err error) {
			m := new(dns.Msg)
			m.SetQuestion(name, dns.TypeA)
			m.SetEdns0(EDNSSize, false)
			c := dns.Client{Net: network, Timeout: 5 * time.Second}
			r, _, err = c.Exchange(m, netip.AddrPortFrom(b.Gateway4, 53).String())
			return err
		})
		if err != nil {
			t.Fatalf("%s %s from the sandbox: %v", network, name, err)
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
	// elements reads the domain set back: address → timeout.
	elements := func() []string {
		t.Helper()
		c, err := nftables.New()
		if err != nil {
			t.Fatal(err)
		}
		els, err := c.GetSetElements(&nftables.Set{Table: &nftables.Table{Name: table, Family: nftables.TableFamilyINet}, Name: nft.DomainSetName(o, 0, false), KeyType: nftables.TypeIPAddr})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range els {
			a, _ := netip.AddrFromSlice(e.Key)
			out = append(out, fmt.Sprintf("%v timeout %v", a, e.Timeout))
		}
		slices.Sort(out)
		return out
	}

	if connects(host.Addr4) {
		t.Fatal("the sandbox reached the test host before resolving its name")
	}
	check(t, "udp www", query("udp", "www.example.com."), fmt.Sprintf("NOERROR | www.example.com. 300 A %v", host.Addr4))
	checkList(t, "set after www", elements(), []string{fmt.Sprintf("%v timeout 5m30s", host.Addr4)})
	if !connects(host.Addr4) {
		t.Error("the sandbox cannot reach the answered address")
	}
	if connects(host.Other4) {
		t.Error("the sandbox reached an address no answer named")
	}

	check(t, "tcp rebind", query("tcp", "rebind.example.com."),
		fmt.Sprintf(`NOERROR | rebind.example.com. 60 A %v | ede 17 "ctld network policy: answers in denied ranges dropped"`, host.Other4))
	want := []string{fmt.Sprintf("%v timeout 5m30s", host.Addr4), fmt.Sprintf("%v timeout 1m30s", host.Other4)}
	slices.Sort(want)
	checkList(t, "set after rebind", elements(), want)
	if !connects(host.Other4) {
		t.Error("the sandbox cannot reach the answered address after the rebind answer")
	}

	check(t, "refused", query("udp", "evil.com."), "REFUSED | "+blockedEDE)
	proxy.Unregister(o.Block.Slot)
	check(t, "unregistered", query("udp", "www.example.com."), "REFUSED")

	// The upstream saw only the allowed names, from the node.
	var names []string
	for _, q := range up.queries() {
		names = append(names, strings.Fields(q)[1])
	}
	checkList(t, "upstream", names, []string{"www.example.com.", "rebind.example.com."})
}
