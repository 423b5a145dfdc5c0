package main

import (
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/ha"
	"github.com/ctld/ctld/internal/metrics"
	"github.com/ctld/ctld/internal/netpolicy"
	"github.com/ctld/ctld/internal/netpolicy/dnsproxy"
	"github.com/prometheus/client_golang/prometheus"
)

// TestUpstreamResolvers: --dns-upstream wins; without it the nameservers
// of resolv.conf are the proxy's upstreams, port 53 unless given.
func TestUpstreamResolvers(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(conf, []byte("# comment\nsearch example\nnameserver 192.0.2.53\nnameserver 2001:db8::53\noptions edns0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o := netOpts{resolvConf: conf}
	got, err := o.upstreamResolvers()
	want := []netip.AddrPort{netip.MustParseAddrPort("192.0.2.53:53"), netip.MustParseAddrPort("[2001:db8::53]:53")}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("from resolv.conf: %v, %v; want %v", got, err, want)
	}
	o.upstreams = []string{"198.51.100.1:5353"}
	if got, err := o.upstreamResolvers(); err != nil || len(got) != 1 || got[0] != netip.MustParseAddrPort("198.51.100.1:5353") {
		t.Fatalf("from the flag: %v, %v", got, err)
	}
}

// TestNodeAddrs: the node's addresses include loopback and leave the
// sandbox pool out.
func TestNodeAddrs(t *testing.T) {
	o := netOpts{poolV4: "127.0.0.0/16", poolV4Bits: 31}
	pool, err := o.pool()
	if err != nil {
		t.Fatal(err)
	}
	all, err := nodeAddrs(netOpts{poolV4: "10.200.0.0/16"}.mustPool(t))
	if err != nil || !slices.Contains(all, netip.MustParseAddr("127.0.0.1")) {
		t.Fatalf("node addresses %v (%v): want 127.0.0.1 among them", all, err)
	}
	in, err := nodeAddrs(pool)
	if err != nil || slices.Contains(in, netip.MustParseAddr("127.0.0.1")) {
		t.Fatalf("with the pool over 127.0.0.0/16: %v (%v), want 127.0.0.1 left out", in, err)
	}
}

func (o netOpts) mustPool(t *testing.T) netpolicy.Pool {
	t.Helper()
	if o.poolV4Bits == 0 {
		o.poolV4Bits = 31
	}
	p, err := o.pool()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestBuildNetElementTTL: the element floor and grace flags reach the DNS
// proxy; their defaults keep its 5 s floor and 30 s grace.
func TestBuildNetElementTTL(t *testing.T) {
	o := netOpts{nftTable: "ctld", poolV4: "10.200.0.0/16", poolV4Bits: 31, dnsPort: 10053, upstreams: []string{"192.0.2.53"},
		elementMinTTL: 10 * time.Minute, elementGrace: time.Second}
	sn, err := buildNet(o, metrics.New(prometheus.NewRegistry(), func() ha.Status { return ha.Status{} }), slog.New(slog.DiscardHandler))
	if err != nil || sn.proxy == nil {
		t.Fatalf("buildNet: %v, proxy %v", err, sn.proxy)
	}
	if got := sn.proxy.ElementTimeout(2); got != 10*time.Minute+time.Second {
		t.Errorf("element timeout of a 2 s answer with --dns-element-min-ttl 10m --dns-element-grace 1s: %v, want 10m1s", got)
	}
	o.elementMinTTL, o.elementGrace = dnsproxy.DefaultElementMinTTL, dnsproxy.DefaultElementGrace
	if sn, err = buildNet(o, metrics.New(prometheus.NewRegistry(), func() ha.Status { return ha.Status{} }), slog.New(slog.DiscardHandler)); err != nil || sn.proxy.ElementTimeout(2) != 35*time.Second {
		t.Errorf("defaults: %v, %v; want 35s", sn.proxy.ElementTimeout(2), err)
	}
}
