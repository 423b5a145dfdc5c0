package dnsproxy

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/netpolicy"
)

// The tests run the proxy on real sockets on 127.0.0.1 against a fake
// upstream (a miekg/dns server of the test's own). The pool is
// 127.0.0.0/24, so a client bound to 127.0.0.3 is slot 1's sandbox,
// 127.0.0.5 slot 2's (Linux answers for all of 127/8 on lo).

var (
	testPool = netpolicy.Pool{V4: netip.MustParsePrefix("127.0.0.0/24"), V6: netip.MustParsePrefix("fd00:c71d::/64")}
	nodeAddr = netip.MustParseAddr("198.51.100.10")
)

// zone is the fake upstream's data: "name. TYPE" → the whole answer
// section it returns (so a test says exactly what a resolver sends). A
// missing key is NXDOMAIN; "tc:" before a key's first record makes UDP
// answers truncated (and empty), as a big answer would be.
var zone = map[string][]string{
	"www.example.com. A":    {"www.example.com. 300 IN A 203.0.113.10", "www.example.com. 300 IN A 203.0.113.11"},
	"www.example.com. AAAA": {"www.example.com. 300 IN AAAA 2001:db8::10"},
	"a.b.example.com. A":    {"a.b.example.com. 300 IN A 203.0.113.12"},
	"api.github.com. A":     {"api.github.com. 60 IN A 140.82.112.5"},
	"pypi.org. A":           {"pypi.org. 7200 IN A 151.101.0.223"},
	"short.example.com. A":  {"short.example.com. 0 IN A 203.0.113.13"},
	"example.com. A":        {"example.com. 300 IN A 203.0.113.99"},
	"evil.com. A":           {"evil.com. 300 IN A 203.0.113.66"},
	// CNAME chains.
	"good.example.com. A": {
		"good.example.com. 300 IN CNAME A.cdn.test.",
		"a.cdn.test. 30 IN CNAME b.cdn.test.",
		"b.cdn.test. 120 IN A 203.0.113.20",
		"evil.test. 300 IN A 203.0.113.66", // off the chain: never used
	},
	"loop.example.com. A": {
		"loop.example.com. 300 IN CNAME l1.cdn.test.",
		"l1.cdn.test. 300 IN CNAME loop.example.com.",
	},
	"partial.example.com. A": {"partial.example.com. 300 IN CNAME p.cdn.test."},
	"p.cdn.test. A":          {"p.cdn.test. 300 IN CNAME q.cdn.test.", "q.cdn.test. 300 IN A 203.0.113.30"},
	"broken.example.com. A": {
		"broken.example.com. 300 IN CNAME x.cdn.test.",
		"y.cdn.test. 300 IN A 203.0.113.66", // not the target's record
	},
	"twocname.example.com. A": {
		"twocname.example.com. 300 IN CNAME m.cdn.test.",
		"twocname.example.com. 300 IN CNAME n.cdn.test.",
		"m.cdn.test. 300 IN A 203.0.113.66",
	},
	"mixed.example.com. A": {
		"mixed.example.com. 300 IN CNAME m.cdn.test.",
		"mixed.example.com. 300 IN A 203.0.113.66",
		"m.cdn.test. 300 IN A 203.0.113.67",
	},
	"eight.example.com. A": chainOf("eight.example.com.", 8, "203.0.113.8"),
	"nine.example.com. A":  chainOf("nine.example.com.", 9, "203.0.113.9"),
	// Rebinding: an allowed name answering into denied ranges.
	"rebind.example.com. A": {
		"rebind.example.com. 300 IN A 169.254.169.254", // metadata
		"rebind.example.com. 300 IN A 127.0.0.5",       // the pool (another sandbox)
		"rebind.example.com. 300 IN A 10.1.2.3",        // RFC 1918
		"rebind.example.com. 300 IN A 198.51.100.10",   // the node
		"rebind.example.com. 300 IN A 100.64.0.1",      // CGNAT
		"rebind.example.com. 300 IN A 203.0.113.40",
	},
	"rebind.example.com. AAAA": {
		"rebind.example.com. 300 IN AAAA fd00:ec2::254",
		"rebind.example.com. 300 IN AAAA ::ffff:169.254.169.254",
		"rebind.example.com. 300 IN AAAA fd00:c71d::9",
		"rebind.example.com. 300 IN AAAA fe80::1",
		"rebind.example.com. 300 IN AAAA 64:ff9b::a9fe:a9fe",   // metadata through DNS64/NAT64
		"rebind.example.com. 300 IN AAAA 64:ff9b::a00:1",       // RFC 1918 through NAT64
		"rebind.example.com. 300 IN AAAA 64:ff9b:1::a9fe:a9fe", // local-use NAT64 prefix
		"rebind.example.com. 300 IN AAAA 2002:a9fe:a9fe::1",    // 6to4
		"rebind.example.com. 300 IN AAAA 2001:db8::40",
	},
	"metadata.example.com. A": {"metadata.example.com. 300 IN A 169.254.169.254"},
	"big.example.com. A":      append([]string{"tc:"}, manyA("big.example.com.", 40)...),
}

// chainOf is an answer with n CNAME links from name, ending in addr.
func chainOf(name string, n int, addr string) []string {
	var out []string
	owner := name
	for i := range n {
		target := fmt.Sprintf("c%d.%s", i+1, "cdn.test.")
		out = append(out, owner+" 300 IN CNAME "+target)
		owner = target
	}
	return append(out, owner+" 300 IN A "+addr)
}

func manyA(name string, n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("%s 300 IN A 203.0.114.%d", name, i+1))
	}
	return out
}

// upstream is a fake resolver serving zone on udp and tcp.
type upstream struct {
	addr string
	mu   sync.Mutex
	zone map[string][]string // a copy of zone, a test may add to
	seen []string            // "udp www.example.com. A"
	// gate holds the answer to a key until the channel is closed.
	gate map[string]chan struct{}
}

func startUpstream(t testing.TB) *upstream {
	t.Helper()
	u := &upstream{zone: maps.Clone(zone)}
	// The same port for UDP and TCP: a free UDP port may be taken for
	// TCP, so pick again a few times.
	var pc net.PacketConn
	var l net.Listener
	for i := 0; l == nil; i++ {
		var err error
		if pc, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		if l, err = net.Listen("tcp", pc.LocalAddr().String()); err != nil {
			pc.Close()
			if i == 7 || !errors.Is(err, syscall.EADDRINUSE) {
				t.Fatal(err)
			}
		}
	}
	u.addr = pc.LocalAddr().String()
	h := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		q := req.Question[0]
		key := dns.CanonicalName(q.Name) + " " + dns.TypeToString[q.Qtype]
		_, udp := w.RemoteAddr().(*net.UDPAddr)
		u.mu.Lock()
		u.seen = append(u.seen, map[bool]string{true: "udp ", false: "tcp "}[udp]+key)
		rrs, ok := u.zone[key]
		gate := u.gate[key]
		u.mu.Unlock()
		if gate != nil {
			<-gate
		}
		m := new(dns.Msg)
		m.SetReply(req)
		m.RecursionAvailable = true
		switch {
		case !ok:
			m.Rcode = dns.RcodeNameError
		case len(rrs) > 0 && rrs[0] == "tc:" && udp:
			m.Truncated = true
		default:
			for _, s := range rrs {
				if s == "tc:" {
					continue
				}
				rr, err := dns.NewRR(s)
				if err != nil {
					panic(err)
				}
				m.Answer = append(m.Answer, rr)
			}
		}
		w.WriteMsg(m)
	})
	serve(t, &dns.Server{PacketConn: pc, Handler: h})
	serve(t, &dns.Server{Listener: l, Handler: h})
	return u
}

// serve runs s until the test ends.
func serve(t testing.TB, s *dns.Server) {
	t.Helper()
	started := make(chan struct{})
	s.NotifyStartedFunc = func() { close(started) }
	done := make(chan error, 1)
	go func() { done <- s.ActivateAndServe() }()
	select {
	case <-started:
	case err := <-done:
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Shutdown()
		<-done
	})
}

func (u *upstream) queries() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.seen)
}

// allowCall is one AllowResolved call.
type allowCall struct {
	owner netpolicy.Owner
	set   int
	addrs []netip.Addr
	ttl   time.Duration
}

func (c allowCall) String() string {
	return fmt.Sprintf("%s set %d %v ttl %v", c.owner.Alias(), c.set, c.addrs, c.ttl)
}

// recorder is a fake Allower: it records each call, can hold it until
// the test releases it, and can fail.
type recorder struct {
	mu    sync.Mutex
	calls []allowCall
	hold  chan struct{} // nil: return at once
	held  chan struct{} // signalled when a call is held
	err   error
}

func (r *recorder) AllowResolved(ctx context.Context, o netpolicy.Owner, set int, addrs []netip.Addr, ttl time.Duration) error {
	r.mu.Lock()
	r.calls = append(r.calls, allowCall{o, set, slices.Clone(addrs), ttl})
	hold, held, err := r.hold, r.held, r.err
	r.mu.Unlock()
	if hold != nil {
		held <- struct{}{}
		select {
		case <-hold:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return err
}

// set replaces hold, held and err.
func (r *recorder) set(hold, held chan struct{}, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hold, r.held, r.err = hold, held, err
}

func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, c := range r.calls {
		out = append(out, c.String())
	}
	r.calls = nil
	return out
}

// testPolicy is the sandboxes' restricted policy: its domain sets are
// 0 = tcp [all but 53, 853] pypi.org, 1 = tcp 443 *.example.com and
// api.github.com, 2 = udp [all but 53] pypi.org.
var testPolicy = netpolicy.Spec{Mode: "restricted", Rules: []netpolicy.RuleSpec{
	{Domain: "*.example.com", Protocol: "tcp", Ports: []string{"443"}},
	{Domain: "api.github.com", Protocol: "tcp", Ports: []string{"443"}},
	{Domain: "pypi.org"},
	{CIDR: "203.0.113.0/24", Protocol: "tcp", Ports: []string{"22"}},
}}

// owner and effective policy of slot s under spec (v6: the block has
// IPv6).
func sandbox(t testing.TB, id string, s netpolicy.Slot, spec netpolicy.Spec, v6 bool) (netpolicy.Owner, netpolicy.Effective) {
	t.Helper()
	pool := testPool
	if !v6 {
		pool.V6 = netip.Prefix{}
	}
	b, err := pool.Block(s)
	if err != nil {
		t.Fatal(err)
	}
	p, err := netpolicy.ParseDefault("network", spec)
	if err != nil {
		t.Fatal(err)
	}
	eff := netpolicy.Resolve(p, netpolicy.Facts{Pool: pool, Block: b, NodeAddrs: []netip.Addr{nodeAddr}})
	return netpolicy.Owner{ID: id, Generation: 1, Block: b}, eff
}

type harness struct {
	p     *Proxy
	up    *upstream
	allow *recorder
	addr  string
}

func start(t testing.TB, mod func(*Config)) *harness {
	t.Helper()
	h := &harness{up: startUpstream(t), allow: &recorder{}}
	cfg := Config{
		Listen:          "127.0.0.1:0",
		Pool:            testPool,
		Upstreams:       []string{h.up.addr},
		Allower:         h.allow,
		UpstreamTimeout: 500 * time.Millisecond,
		QueryTimeout:    2 * time.Second,
	}
	if mod != nil {
		mod(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Listen(); err != nil {
		t.Fatal(err)
	}
	h.p, h.addr = p, p.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	o, eff := sandbox(t, "web", 1, testPolicy, true)
	p.Register(o, eff)
	return h
}

const (
	src1 = "127.0.0.3" // slot 1's sandbox
	src2 = "127.0.0.5" // slot 2's sandbox
)

// query asks the proxy for name over network ("udp" or "tcp") from src,
// with EDNS.
func (h *harness) query(t *testing.T, network, src, name string, qtype uint16) *dns.Msg {
	t.Helper()
	r, err := h.try(network, src, name, qtype, true)
	if err != nil {
		t.Fatalf("query %s %s from %s over %s: %v", name, dns.TypeToString[qtype], src, network, err)
	}
	return r
}

func (h *harness) try(network, src, name string, qtype uint16, edns bool) (*dns.Msg, error) {
	var local net.Addr = &net.UDPAddr{IP: net.ParseIP(src)}
	if network == "tcp" {
		local = &net.TCPAddr{IP: net.ParseIP(src)}
	}
	c := dns.Client{Net: network, Timeout: 5 * time.Second, Dialer: &net.Dialer{LocalAddr: local, Timeout: 5 * time.Second}}
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	if edns {
		m.SetEdns0(EDNSSize, false)
	}
	r, _, err := c.Exchange(m, h.addr)
	return r, err
}

// show renders an answer as one line: rcode, flags, records (owner TTL
// type data), EDE.
func show(m *dns.Msg) string {
	parts := []string{dns.RcodeToString[m.Rcode]}
	if m.Truncated {
		parts = append(parts, "tc")
	}
	for _, rr := range m.Answer {
		f := strings.Fields(rr.String())
		parts = append(parts, f[0]+" "+f[1]+" "+f[3]+" "+f[4])
	}
	if opt := m.IsEdns0(); opt != nil {
		for _, o := range opt.Option {
			if e, ok := o.(*dns.EDNS0_EDE); ok {
				parts = append(parts, fmt.Sprintf("ede %d %q", e.InfoCode, e.ExtraText))
			}
		}
	}
	return strings.Join(parts, " | ")
}

func check(t *testing.T, what, got, want string) {
	t.Helper()
	if got != want {
		t.Errorf("%s:\ngot  %s\nwant %s", what, got, want)
	}
}

func checkList(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s:\ngot  %q\nwant %q", what, got, want)
	}
}

const blockedEDE = `ede 15 "ctld network policy"`

// TestAllowedBeforeAnswer: an allowed name resolves, and the Allower has
// the answer's addresses before the client gets the answer: the proxy
// sends nothing while the Allower is held.
func TestAllowedBeforeAnswer(t *testing.T) {
	h := start(t, nil)
	hold, held := make(chan struct{}), make(chan struct{}, 1)
	h.allow.set(hold, held, nil)
	got := make(chan *dns.Msg, 1)
	go func() {
		r, err := h.try("udp", src1, "www.example.com.", dns.TypeA, true)
		if err != nil {
			t.Error(err)
		}
		got <- r
	}()
	select {
	case <-held:
	case <-time.After(5 * time.Second):
		t.Fatal("the Allower was never called")
	}
	select {
	case r := <-got:
		t.Fatalf("the client got an answer while the Allower had not returned: %v", r)
	case <-time.After(300 * time.Millisecond):
	}
	checkList(t, "allowed", h.allow.take(), []string{"web-g1 set 1 [203.0.113.10 203.0.113.11] ttl 5m30s"})
	close(hold)
	r := <-got
	if r == nil {
		t.FailNow()
	}
	check(t, "answer", show(r), "NOERROR | www.example.com. 300 A 203.0.113.10 | www.example.com. 300 A 203.0.113.11")
	checkList(t, "upstream", h.up.queries(), []string{"udp www.example.com. A"})
}

// TestNames: which names are answered, refused (with EDE 15) or NODATA,
// and which sets the answers join.
func TestNames(t *testing.T) {
	h := start(t, nil)
	for _, c := range []struct {
		name  string
		qtype uint16
		want  string
		allow []string
	}{
		{"www.example.com.", dns.TypeAAAA, "NOERROR | www.example.com. 300 AAAA 2001:db8::10", []string{"web-g1 set 1 [2001:db8::10] ttl 5m30s"}},
		{"WWW.Example.COM.", dns.TypeA, "NOERROR | www.example.com. 300 A 203.0.113.10 | www.example.com. 300 A 203.0.113.11", []string{"web-g1 set 1 [203.0.113.10 203.0.113.11] ttl 5m30s"}},
		{"a.b.example.com.", dns.TypeA, "NOERROR | a.b.example.com. 300 A 203.0.113.12", []string{"web-g1 set 1 [203.0.113.12] ttl 5m30s"}},
		{"api.github.com.", dns.TypeA, "NOERROR | api.github.com. 60 A 140.82.112.5", []string{"web-g1 set 1 [140.82.112.5] ttl 1m30s"}},
		// pypi.org is in two sets (tcp and udp): both get the address.
		{"pypi.org.", dns.TypeA, "NOERROR | pypi.org. 3600 A 151.101.0.223", []string{"web-g1 set 0 [151.101.0.223] ttl 1h0m30s", "web-g1 set 2 [151.101.0.223] ttl 1h0m30s"}},
		// *.example.com is strictly below example.com.
		{"example.com.", dns.TypeA, "REFUSED | " + blockedEDE, nil},
		{"badexample.com.", dns.TypeA, "REFUSED | " + blockedEDE, nil},
		{"evil.com.", dns.TypeA, "REFUSED | " + blockedEDE, nil},
		{"github.com.", dns.TypeA, "REFUSED | " + blockedEDE, nil},
		{"www.github.com.", dns.TypeA, "REFUSED | " + blockedEDE, nil},
		{"evil.com.", dns.TypeAAAA, "REFUSED | " + blockedEDE, nil},
		{"evil.com.", dns.TypeTXT, "REFUSED | " + blockedEDE, nil},
		// A label holding an escaped dot is not below example.com.
		{`evil\.example.com.`, dns.TypeA, "REFUSED | " + blockedEDE, nil},
		{`x\000.example.com.`, dns.TypeA, "REFUSED | " + blockedEDE, nil},
		// Allowed names: only addresses are forwarded.
		{"www.example.com.", dns.TypeTXT, "NOERROR", nil},
		{"www.example.com.", dns.TypeMX, "NOERROR", nil},
		{"www.example.com.", dns.TypeANY, "NOERROR", nil},
		// An allowed name that does not exist.
		{"nx.example.com.", dns.TypeA, "NXDOMAIN", nil},
	} {
		r := h.query(t, "udp", src1, c.name, c.qtype)
		check(t, c.name+" "+dns.TypeToString[c.qtype], show(r), c.want)
		checkList(t, c.name+" allowed", h.allow.take(), c.allow)
	}
	// Refused and NODATA names never reach the upstream.
	checkList(t, "upstream", h.up.queries(), []string{
		"udp www.example.com. AAAA", "udp www.example.com. A", "udp a.b.example.com. A",
		"udp api.github.com. A", "udp pypi.org. A", "udp nx.example.com. A"})
}

// TestModes: deny_all refuses everything; open answers every name but
// still strips denied ranges and adds nothing to any set; a sandbox
// without IPv6 gets NODATA for AAAA.
func TestModes(t *testing.T) {
	h := start(t, nil)
	o, eff := sandbox(t, "shut", 2, netpolicy.Spec{}, true)
	h.p.Register(o, eff)
	check(t, "deny_all", show(h.query(t, "udp", src2, "www.example.com.", dns.TypeA)), "REFUSED | "+blockedEDE)

	o, eff = sandbox(t, "open", 2, netpolicy.Spec{Mode: "open"}, true)
	h.p.Register(o, eff) // replaces the deny_all entry of slot 2
	check(t, "open", show(h.query(t, "udp", src2, "evil.com.", dns.TypeA)), "NOERROR | evil.com. 300 A 203.0.113.66")
	check(t, "open rebind", show(h.query(t, "udp", src2, "rebind.example.com.", dns.TypeA)),
		`NOERROR | rebind.example.com. 300 A 203.0.113.40 | ede 17 "ctld network policy: answers in denied ranges dropped"`)
	checkList(t, "open allowed", h.allow.take(), nil)

	o, eff = sandbox(t, "v4only", 2, testPolicy, false)
	h.p.Register(o, eff)
	check(t, "no v6", show(h.query(t, "udp", src2, "www.example.com.", dns.TypeAAAA)), "NOERROR")
	check(t, "no v6, A", show(h.query(t, "udp", src2, "www.example.com.", dns.TypeA)),
		"NOERROR | www.example.com. 300 A 203.0.113.10 | www.example.com. 300 A 203.0.113.11")
	checkList(t, "v4only allowed", h.allow.take(), []string{"v4only-g1 set 1 [203.0.113.10 203.0.113.11] ttl 5m30s"})
}

// TestCNAMEChains: a chain is followed from the queried name; a loop, a
// chain longer than MaxChain, two CNAMEs for a name or a CNAME beside
// addresses is SERVFAIL; records off the chain are never used; a partial
// chain is followed by the proxy itself.
func TestCNAMEChains(t *testing.T) {
	h := start(t, nil)
	for _, c := range []struct {
		name     string
		want     string
		allow    []string
		upstream []string
	}{
		{"good.example.com.", "NOERROR | good.example.com. 30 CNAME A.cdn.test. | a.cdn.test. 30 CNAME b.cdn.test. | b.cdn.test. 30 A 203.0.113.20",
			[]string{"web-g1 set 1 [203.0.113.20] ttl 1m0s"}, []string{"udp good.example.com. A"}},
		{"partial.example.com.", "NOERROR | partial.example.com. 300 CNAME p.cdn.test. | p.cdn.test. 300 CNAME q.cdn.test. | q.cdn.test. 300 A 203.0.113.30",
			[]string{"web-g1 set 1 [203.0.113.30] ttl 5m30s"}, []string{"udp partial.example.com. A", "udp p.cdn.test. A"}},
		// y.cdn.test's record is not the target's: the proxy asks for the
		// target, which does not exist.
		{"broken.example.com.", "NXDOMAIN | broken.example.com. 300 CNAME x.cdn.test.",
			nil, []string{"udp broken.example.com. A", "udp x.cdn.test. A"}},
		{"loop.example.com.", "SERVFAIL", nil, []string{"udp loop.example.com. A"}},
		{"twocname.example.com.", "SERVFAIL", nil, []string{"udp twocname.example.com. A"}},
		{"mixed.example.com.", "SERVFAIL", nil, []string{"udp mixed.example.com. A"}},
		{"nine.example.com.", "SERVFAIL", nil, []string{"udp nine.example.com. A"}},
	} {
		r := h.query(t, "udp", src1, c.name, dns.TypeA)
		check(t, c.name, show(r), c.want)
		checkList(t, c.name+" allowed", h.allow.take(), c.allow)
		checkList(t, c.name+" upstream", h.up.queries(), c.upstream)
		h.up.mu.Lock()
		h.up.seen = nil
		h.up.mu.Unlock()
	}
	r := h.query(t, "udp", src1, "eight.example.com.", dns.TypeA)
	if len(r.Answer) != 9 || r.Rcode != dns.RcodeSuccess {
		t.Errorf("eight links: %s", show(r))
	}
	checkList(t, "eight allowed", h.allow.take(), []string{"web-g1 set 1 [203.0.113.8] ttl 5m30s"})
}

// TestCNAMEChainFollowLimit: a resolver that answers every name with one
// more CNAME is followed at most MaxChain links.
func TestCNAMEChainFollowLimit(t *testing.T) {
	h := start(t, nil)
	h.up.mu.Lock()
	for i := range 20 {
		owner := "follow.example.com."
		if i > 0 {
			owner = fmt.Sprintf("f%d.cdn.test.", i)
		}
		h.up.zone[owner+" A"] = []string{fmt.Sprintf("%s 300 IN CNAME f%d.cdn.test.", owner, i+1)}
	}
	h.up.mu.Unlock()
	check(t, "follow", show(h.query(t, "udp", src1, "follow.example.com.", dns.TypeA)), "SERVFAIL")
	if n := len(h.up.queries()); n != MaxChain+1 {
		t.Errorf("the proxy asked the upstream %d times, want %d: %q", n, MaxChain+1, h.up.queries())
	}
	checkList(t, "allowed", h.allow.take(), nil)
}

// TestDenyRangesStripped: DNS rebinding to metadata, the node, the pool
// (other sandboxes), private and CGNAT ranges, v4-mapped and link-local
// IPv6: those answers are dropped and never reach the Allower.
func TestDenyRangesStripped(t *testing.T) {
	h := start(t, nil)
	const ede17 = `ede 17 "ctld network policy: answers in denied ranges dropped"`
	check(t, "A", show(h.query(t, "udp", src1, "rebind.example.com.", dns.TypeA)), "NOERROR | rebind.example.com. 300 A 203.0.113.40 | "+ede17)
	checkList(t, "A allowed", h.allow.take(), []string{"web-g1 set 1 [203.0.113.40] ttl 5m30s"})
	check(t, "AAAA", show(h.query(t, "udp", src1, "rebind.example.com.", dns.TypeAAAA)), "NOERROR | rebind.example.com. 300 AAAA 2001:db8::40 | "+ede17)
	checkList(t, "AAAA allowed", h.allow.take(), []string{"web-g1 set 1 [2001:db8::40] ttl 5m30s"})
	check(t, "only metadata", show(h.query(t, "udp", src1, "metadata.example.com.", dns.TypeA)), "NOERROR | "+ede17)
	checkList(t, "only metadata allowed", h.allow.take(), nil)

	// A rule naming the metadata address opens it, for the proxy too.
	spec := testPolicy
	spec.Rules = append(slices.Clone(spec.Rules), netpolicy.RuleSpec{CIDR: "169.254.169.254", Protocol: "tcp", Ports: []string{"80"}})
	o, eff := sandbox(t, "meta", 2, spec, true)
	h.p.Register(o, eff)
	check(t, "metadata named", show(h.query(t, "udp", src2, "metadata.example.com.", dns.TypeA)), "NOERROR | metadata.example.com. 300 A 169.254.169.254")
	checkList(t, "metadata named allowed", h.allow.take(), []string{"meta-g1 set 1 [169.254.169.254] ttl 5m30s"})
}

// TestTTL: the set element lives min(TTL, 1h), at least 5 s, plus 30 s
// grace; the client's TTL is capped at 1 h, and a chain's records share
// its least TTL (checked in TestCNAMEChains).
func TestTTL(t *testing.T) {
	def, err := New(Config{Listen: "127.0.0.1:0", Pool: testPool, Upstreams: []string{"127.0.0.1:1"}, Allower: &recorder{}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ttl  uint32
		want time.Duration
	}{{0, 35 * time.Second}, {4, 35 * time.Second}, {5, 35 * time.Second}, {60, 90 * time.Second}, {3600, time.Hour + 30*time.Second}, {7200, time.Hour + 30*time.Second}, {1 << 31, time.Hour + 30*time.Second}} {
		if got := def.elementTTL(c.ttl); got != c.want {
			t.Errorf("elementTTL(%d) = %v, want %v", c.ttl, got, c.want)
		}
	}
	h := start(t, nil)
	check(t, "ttl 0", show(h.query(t, "udp", src1, "short.example.com.", dns.TypeA)), "NOERROR | short.example.com. 0 A 203.0.113.13")
	checkList(t, "ttl 0 allowed", h.allow.take(), []string{"web-g1 set 1 [203.0.113.13] ttl 35s"})
	check(t, "ttl 7200", show(h.query(t, "udp", src1, "pypi.org.", dns.TypeA)), "NOERROR | pypi.org. 3600 A 151.101.0.223")
	checkList(t, "ttl 7200 allowed", h.allow.take(), []string{"web-g1 set 0 [151.101.0.223] ttl 1h0m30s", "web-g1 set 2 [151.101.0.223] ttl 1h0m30s"})
}

// TestTTLConfigured: the element floor and grace are the configured
// ones (the guest still gets the answer's own TTL); out of range values
// are refused by New.
func TestTTLConfigured(t *testing.T) {
	h := start(t, func(c *Config) { c.ElementMinTTL, c.ElementGrace = 10*time.Minute, time.Second })
	check(t, "ttl 0", show(h.query(t, "udp", src1, "short.example.com.", dns.TypeA)), "NOERROR | short.example.com. 0 A 203.0.113.13")
	checkList(t, "ttl 0 allowed", h.allow.take(), []string{"web-g1 set 1 [203.0.113.13] ttl 10m1s"})
	check(t, "ttl 7200", show(h.query(t, "udp", src1, "pypi.org.", dns.TypeA)), "NOERROR | pypi.org. 3600 A 151.101.0.223")
	checkList(t, "ttl 7200 allowed", h.allow.take(), []string{"web-g1 set 0 [151.101.0.223] ttl 1h0m1s", "web-g1 set 2 [151.101.0.223] ttl 1h0m1s"})

	for _, c := range []struct {
		floor, grace time.Duration
		want         string
	}{
		{-time.Second, 0, "dns proxy: element TTL floor -1s: want at most 1h0m0s"},
		{MaxTTL + time.Second, 0, "dns proxy: element TTL floor 1h0m1s: want at most 1h0m0s"},
		{0, -time.Second, "dns proxy: element grace -1s: want at most 1h0m0s"},
		{0, MaxElementGrace + time.Second, "dns proxy: element grace 1h0m1s: want at most 1h0m0s"},
	} {
		_, err := New(Config{Listen: "127.0.0.1:0", Pool: testPool, Upstreams: []string{"127.0.0.1:1"}, Allower: &recorder{}, ElementMinTTL: c.floor, ElementGrace: c.grace})
		if err == nil || !strings.Contains(err.Error(), c.want) || !errdefs.Is(err, errdefs.CodeInvalidArgument) {
			t.Errorf("New with floor %v, grace %v: %v; want invalid_argument %q", c.floor, c.grace, err, c.want)
		}
	}
}

// TestTCP: the same answers over TCP; a big answer is truncated over UDP
// (the client retries over TCP), and the proxy itself retries a
// truncated upstream answer over TCP.
func TestTCP(t *testing.T) {
	h := start(t, nil)
	check(t, "tcp", show(h.query(t, "tcp", src1, "www.example.com.", dns.TypeA)), "NOERROR | www.example.com. 300 A 203.0.113.10 | www.example.com. 300 A 203.0.113.11")
	checkList(t, "tcp allowed", h.allow.take(), []string{"web-g1 set 1 [203.0.113.10 203.0.113.11] ttl 5m30s"})
	check(t, "tcp refused", show(h.query(t, "tcp", src1, "evil.com.", dns.TypeA)), "REFUSED | "+blockedEDE)
	check(t, "tcp chain", show(h.query(t, "tcp", src1, "loop.example.com.", dns.TypeA)), "SERVFAIL")

	r := h.query(t, "tcp", src1, "big.example.com.", dns.TypeA)
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != MaxAddrs {
		t.Errorf("big over tcp: want %d addresses (MaxAddrs), got %s", MaxAddrs, show(r))
	}
	checkList(t, "upstream", h.up.queries()[2:], []string{"udp big.example.com. A", "tcp big.example.com. A"})
	calls := h.allow.take()
	if len(calls) != 1 || !strings.Contains(calls[0], "203.0.114.32]") || strings.Contains(calls[0], "203.0.114.33") {
		t.Errorf("big: the Allower must see exactly the first %d addresses: %q", MaxAddrs, calls)
	}
	r, err := h.try("udp", src1, "big.example.com.", dns.TypeA, false)
	if err != nil {
		t.Fatal(err)
	}
	r.Compress = true
	if wire, err := r.Pack(); err != nil || !r.Truncated || len(wire) > dns.MinMsgSize || len(r.Answer) == 0 {
		t.Errorf("big over udp without EDNS: want truncated to %d bytes, got %d bytes (%v): %s", dns.MinMsgSize, len(wire), err, show(r))
	}
}

// TestUpstreamFailures: no upstream answers → SERVFAIL within the query
// timeout, nothing allowed; a dead first upstream falls through to the
// next; an Allower error is SERVFAIL (fail closed).
func TestUpstreamFailures(t *testing.T) {
	// refused: a port nobody answers on; blackhole: a socket that reads
	// nothing. The refused port stays bound by a socket connected
	// elsewhere, which the kernel does not deliver the proxy's datagrams
	// to (it answers port unreachable), so no other socket can take the
	// port in the meantime, as it could a closed one's.
	held, err := net.Dial("udp", "127.0.0.1:9")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	refused := held.LocalAddr().String()
	hole, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hole.Close()

	h := start(t, func(c *Config) { c.Upstreams = []string{refused, hole.LocalAddr().String()} })
	t0 := time.Now()
	check(t, "down", show(h.query(t, "udp", src1, "www.example.com.", dns.TypeA)), "SERVFAIL")
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("SERVFAIL took %v, more than the query timeout", d)
	}
	check(t, "down tcp", show(h.query(t, "tcp", src1, "www.example.com.", dns.TypeA)), "SERVFAIL")
	checkList(t, "down allowed", h.allow.take(), nil)

	h2 := start(t, func(c *Config) { c.Upstreams = append([]string{refused, hole.LocalAddr().String()}, c.Upstreams...) })
	check(t, "fallback", show(h2.query(t, "udp", src1, "www.example.com.", dns.TypeA)), "NOERROR | www.example.com. 300 A 203.0.113.10 | www.example.com. 300 A 203.0.113.11")

	h2.allow.set(nil, nil, errors.New("nft: netlink: no such set"))
	check(t, "allower fails", show(h2.query(t, "udp", src1, "www.example.com.", dns.TypeA)), "SERVFAIL")
}

// TestSources: only a registered slot's sandbox address is answered:
// unknown slots, unregistered ones, the gateway and addresses outside the
// pool are REFUSED (without EDE: the proxy does not know them).
func TestSources(t *testing.T) {
	h := start(t, nil)
	const want = "NOERROR | www.example.com. 300 A 203.0.113.10 | www.example.com. 300 A 203.0.113.11"
	check(t, "slot 1", show(h.query(t, "udp", src1, "www.example.com.", dns.TypeA)), want)
	check(t, "slot 2 unknown", show(h.query(t, "udp", src2, "www.example.com.", dns.TypeA)), "REFUSED")
	check(t, "slot 1 gateway", show(h.query(t, "udp", "127.0.0.2", "www.example.com.", dns.TypeA)), "REFUSED")
	check(t, "slot 0", show(h.query(t, "udp", "127.0.0.1", "www.example.com.", dns.TypeA)), "REFUSED")
	check(t, "outside the pool", show(h.query(t, "udp", "127.0.1.3", "www.example.com.", dns.TypeA)), "REFUSED")
	checkList(t, "allowed", h.allow.take(), []string{"web-g1 set 1 [203.0.113.10 203.0.113.11] ttl 5m30s"})

	o, eff := sandbox(t, "api", 2, testPolicy, true)
	if h.p.Registered(2) {
		t.Fatal("slot 2 registered before Register")
	}
	h.p.Register(o, eff)
	if !h.p.Registered(2) {
		t.Fatal("slot 2 not registered after Register")
	}
	check(t, "slot 2 registered", show(h.query(t, "tcp", src2, "www.example.com.", dns.TypeA)), want)
	checkList(t, "allowed", h.allow.take(), []string{"api-g1 set 1 [203.0.113.10 203.0.113.11] ttl 5m30s"})
	h.p.Unregister(2)
	h.p.Unregister(2) // absent is success
	if h.p.Registered(2) {
		t.Fatal("slot 2 registered after Unregister")
	}
	check(t, "slot 2 unregistered", show(h.query(t, "udp", src2, "www.example.com.", dns.TypeA)), "REFUSED")
	check(t, "slot 1 still", show(h.query(t, "udp", src1, "www.example.com.", dns.TypeA)), want)
}

// holdOne registers a second sandbox (slot 2), then holds a query of
// src1's sandbox in the Allower: close hold to let it go, its error
// comes on first. c (from src, short timeout) and m (a NODATA question:
// it needs neither upstream nor Allower) probe the limits meanwhile.
func (h *harness) holdOne(t *testing.T, src string) (hold chan struct{}, first chan error, c dns.Client, m *dns.Msg) {
	t.Helper()
	o, eff := sandbox(t, "other", 2, testPolicy, true)
	h.p.Register(o, eff)
	hold, held := make(chan struct{}), make(chan struct{}, 1)
	h.allow.set(hold, held, nil)
	first = make(chan error, 1)
	go func() {
		_, err := h.try("udp", src1, "www.example.com.", dns.TypeA, true)
		first <- err
	}()
	<-held
	c = dns.Client{Net: "udp", Timeout: 500 * time.Millisecond, Dialer: &net.Dialer{LocalAddr: &net.UDPAddr{IP: net.ParseIP(src)}}}
	m = new(dns.Msg)
	m.SetQuestion("www.example.com.", dns.TypeTXT)
	return hold, first, c, m
}

// TestInFlightLimit: with one query of the sandbox held in the Allower
// and MaxPerSandbox 1, its next query is dropped (no answer), another
// sandbox's is answered.
func TestInFlightLimit(t *testing.T) {
	h := start(t, func(c *Config) { c.MaxPerSandbox = 1; c.QueryTimeout = 3 * time.Second })
	hold, first, c, m := h.holdOne(t, src1)
	if r, _, err := c.Exchange(m, h.addr); err == nil {
		t.Errorf("a second query of a sandbox at its limit was answered: %s", show(r))
	}
	h.allow.set(nil, nil, nil) // the other sandbox's call returns at once
	check(t, "other sandbox", show(h.query(t, "udp", src2, "api.github.com.", dns.TypeA)), "NOERROR | api.github.com. 60 A 140.82.112.5")
	close(hold)
	if err := <-first; err != nil {
		t.Errorf("the held query: %v", err)
	}
}

// TestServeStops: Serve returns nil when its context ends, and the port
// is free again; Close on a proxy that never served releases its
// listeners.
func TestServeStops(t *testing.T) {
	p, err := New(Config{Listen: "127.0.0.1:0", Pool: testPool, Upstreams: []string{"127.0.0.1:1"}, Allower: &recorder{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx) }()
	var addr netip.AddrPort
	for addr = p.Addr(); !addr.IsValid(); addr = p.Addr() {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after its context ended")
	}
	for _, network := range []string{"udp", "tcp"} {
		var err error
		if network == "udp" {
			var pc net.PacketConn
			if pc, err = net.ListenPacket(network, addr.String()); err == nil {
				pc.Close()
			}
		} else {
			var l net.Listener
			if l, err = net.Listen(network, addr.String()); err == nil {
				l.Close()
			}
		}
		if err != nil {
			t.Errorf("%s port %v not free after Serve returned: %v", network, addr, err)
		}
	}

	p2, err := New(Config{Listen: "127.0.0.1:0", Pool: testPool, Upstreams: []string{"127.0.0.1:1"}, Allower: &recorder{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p2.Listen(); err != nil {
		t.Fatal(err)
	}
	addr = p2.Addr()
	if err := p2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p2.Serve(context.Background()); err != nil {
		t.Errorf("Serve after Close: %v", err)
	}
	l, err := net.Listen("tcp", addr.String())
	if err != nil {
		t.Errorf("tcp port not free after Close: %v", err)
	} else {
		l.Close()
	}
}

// TestNewRefuses: a config the proxy cannot serve is refused.
func TestNewRefuses(t *testing.T) {
	dir := t.TempDir()
	empty := dir + "/resolv.conf"
	if err := os.WriteFile(empty, []byte("search example.com\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	withNS := dir + "/resolv2.conf"
	if err := os.WriteFile(withNS, []byte("nameserver 192.0.2.53\nnameserver 2001:db8::53\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	good := Config{Listen: "127.0.0.1:0", Pool: testPool, Upstreams: []string{"127.0.0.1"}, Allower: &recorder{}}
	for _, c := range []struct {
		what string
		mod  func(*Config)
		want string
	}{
		{"no allower", func(c *Config) { c.Allower = nil }, "no Allower"},
		{"bad pool", func(c *Config) { c.Pool = netpolicy.Pool{} }, "address pool"},
		{"bad listen", func(c *Config) { c.Listen = "5300" }, "listen address"},
		{"bad upstream", func(c *Config) { c.Upstreams = []string{"dns.example"} }, "upstream"},
		{"no upstreams", func(c *Config) { c.Upstreams = nil; c.ResolvConf = empty }, "no upstream resolvers"},
		{"no resolv.conf", func(c *Config) { c.Upstreams = nil; c.ResolvConf = dir + "/missing" }, "reading"},
	} {
		cfg := good
		c.mod(&cfg)
		if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error with %q", c.what, err, c.want)
		}
	}
	cfg := good
	cfg.Upstreams, cfg.ResolvConf = nil, withNS
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkList(t, "upstreams from resolv.conf", p.Upstreams(), []string{"192.0.2.53:53", "[2001:db8::53]:53"})
}

// TestChainErrors: each bad chain is refused for its own reason (the
// answers above are SERVFAIL whichever check caught them).
func TestChainErrors(t *testing.T) {
	h := start(t, nil)
	for name, want := range map[string]string{
		"loop.example.com.":     "CNAME chain of loop.example.com.: loop at loop.example.com.",
		"nine.example.com.":     "CNAME chain of nine.example.com.: more than 8 links",
		"twocname.example.com.": "CNAME chain of twocname.example.com.: 2 CNAMEs for twocname.example.com.",
		"mixed.example.com.":    "CNAME chain of mixed.example.com.: mixed.example.com. has a CNAME and addresses",
	} {
		_, err := h.p.resolve(context.Background(), name, dns.TypeA)
		var ce *ChainError
		if !errors.As(err, &ce) || err.Error() != want {
			t.Errorf("%s: got %v, want a ChainError %q", name, err, want)
		}
	}
}

// TestDualStackListener: with an empty host (how ctld listens: the
// redirect sends each sandbox's query to its own gateway address) the
// sockets are dual-stack, and an IPv4 source, which the socket reports
// v4-mapped, is still its sandbox.
func TestDualStackListener(t *testing.T) {
	h := start(t, func(c *Config) { c.Listen = ":0" })
	h.addr = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), h.p.Addr().Port()).String()
	const want = "NOERROR | www.example.com. 300 A 203.0.113.10 | www.example.com. 300 A 203.0.113.11"
	check(t, "udp", show(h.query(t, "udp", src1, "www.example.com.", dns.TypeA)), want)
	check(t, "tcp", show(h.query(t, "tcp", src1, "www.example.com.", dns.TypeA)), want)
	check(t, "unknown", show(h.query(t, "udp", src2, "www.example.com.", dns.TypeA)), "REFUSED")
}

// TestOversizedQuery: a datagram larger than EDNSSize is not a query the
// proxy reads: it gets no answer.
func TestOversizedQuery(t *testing.T) {
	h := start(t, nil)
	m := new(dns.Msg)
	m.SetQuestion("www.example.com.", dns.TypeA)
	m.SetEdns0(EDNSSize, false)
	m.IsEdns0().Option = append(m.IsEdns0().Option, &dns.EDNS0_PADDING{Padding: make([]byte, 2*EDNSSize)})
	c := dns.Client{Net: "udp", Timeout: 500 * time.Millisecond, Dialer: &net.Dialer{LocalAddr: &net.UDPAddr{IP: net.ParseIP(src1)}}}
	if r, _, err := c.Exchange(m, h.addr); err == nil && r.Rcode == dns.RcodeSuccess {
		t.Errorf("an oversized query was answered: %s", show(r))
	}
	checkList(t, "upstream", h.up.queries(), nil)
}

// TestServeWaitsForPort: a port held by another process (a previous
// primary that has not exited yet) is bound as soon as it is free, and
// then answered on.
func TestServeWaitsForPort(t *testing.T) {
	up := startUpstream(t)
	held, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := held.LocalAddr().String()
	p, err := New(Config{Listen: addr, Pool: testPool, Upstreams: []string{up.addr}, Allower: &recorder{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Listen(); !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("Listen on a held port: got %v, want EADDRINUSE", err)
	}
	o, eff := sandbox(t, "web", 1, testPolicy, true)
	p.Register(o, eff)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	time.Sleep(3 * bindRetry)
	if p.Addr().IsValid() {
		t.Fatal("bound while the port was held")
	}
	held.Close()
	freed := time.Now()
	for !p.Addr().IsValid() {
		if time.Since(freed) > 10*bindRetry {
			t.Fatalf("not bound %v after the port was freed", time.Since(freed))
		}
		time.Sleep(5 * time.Millisecond)
	}
	h := &harness{p: p, addr: addr}
	check(t, "after the port is free", show(h.query(t, "udp", src1, "www.example.com.", dns.TypeA)),
		"NOERROR | www.example.com. 300 A 203.0.113.10 | www.example.com. 300 A 203.0.113.11")
}

// TestRegisterWaitsForAllower: Register (and Unregister) return only
// after the replaced entry's Allower calls in flight returned, so the
// node can apply a new policy knowing no answer of the old one follows.
func TestRegisterWaitsForAllower(t *testing.T) {
	for _, op := range []string{"register", "unregister"} {
		t.Run(op, func(t *testing.T) {
			h := start(t, nil)
			hold, held := make(chan struct{}), make(chan struct{}, 1)
			h.allow.set(hold, held, nil)
			answered := make(chan *dns.Msg, 1)
			go func() {
				r, _ := h.try("udp", src1, "www.example.com.", dns.TypeA, true)
				answered <- r
			}()
			<-held
			returned := make(chan struct{})
			go func() {
				if op == "register" {
					o, eff := sandbox(t, "web", 1, netpolicy.Spec{Mode: "open"}, true)
					o.Generation = 2
					h.p.Register(o, eff)
				} else {
					h.p.Unregister(1)
				}
				close(returned)
			}()
			select {
			case <-returned:
				t.Fatalf("%s returned while an Allower call of the entry it replaces was in flight", op)
			case <-time.After(300 * time.Millisecond):
			}
			close(hold)
			select {
			case <-returned:
			case <-time.After(5 * time.Second):
				t.Fatalf("%s did not return after the Allower call did", op)
			}
			if r := <-answered; r == nil || r.Rcode != dns.RcodeSuccess {
				t.Errorf("the query in flight: %v", r)
			}
		})
	}
}

// TestPolicyChangeDuringQuery: a query whose name the policy registered
// while its upstream answered no longer allows is refused, and nothing of
// it reaches the Allower; one the new policy allows joins the new
// generation's sets.
func TestPolicyChangeDuringQuery(t *testing.T) {
	for _, c := range []struct {
		what  string
		spec  netpolicy.Spec
		want  string
		allow []string
	}{
		{"now refused", netpolicy.Spec{Mode: "restricted", Rules: []netpolicy.RuleSpec{{Domain: "api.github.com"}}}, "REFUSED | " + blockedEDE, nil},
		{"still allowed", netpolicy.Spec{Mode: "restricted", Rules: []netpolicy.RuleSpec{{Domain: "www.example.com", Protocol: "udp"}}},
			"NOERROR | www.example.com. 300 A 203.0.113.10 | www.example.com. 300 A 203.0.113.11", []string{"web-g2 set 0 [203.0.113.10 203.0.113.11] ttl 5m30s"}},
		{"unregistered", netpolicy.Spec{}, "REFUSED", nil},
	} {
		t.Run(c.what, func(t *testing.T) {
			h := start(t, nil)
			gate := make(chan struct{})
			h.up.mu.Lock()
			h.up.gate = map[string]chan struct{}{"www.example.com. A": gate}
			h.up.mu.Unlock()
			answered := make(chan *dns.Msg, 1)
			go func() {
				r, _ := h.try("udp", src1, "www.example.com.", dns.TypeA, true)
				answered <- r
			}()
			for deadline := time.Now().Add(5 * time.Second); len(h.up.queries()) == 0; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the query never reached the upstream")
				}
			}
			if c.spec.Mode == "" {
				h.p.Unregister(1)
			} else {
				o, eff := sandbox(t, "web", 1, c.spec, true)
				o.Generation = 2
				h.p.Register(o, eff)
			}
			close(gate)
			r := <-answered
			if r == nil {
				t.Fatal("no answer")
			}
			check(t, "answer", show(r), c.want)
			checkList(t, "allowed", h.allow.take(), c.allow)
		})
	}
}

// TestGlobalInFlightLimit: with MaxInFlight 1 and one query held in the
// Allower, another sandbox's query is dropped too.
func TestGlobalInFlightLimit(t *testing.T) {
	h := start(t, func(c *Config) { c.MaxInFlight = 1 })
	hold, first, c, m := h.holdOne(t, src2)
	if r, _, err := c.Exchange(m, h.addr); err == nil {
		t.Errorf("a query beyond MaxInFlight was answered: %s", show(r))
	}
	close(hold)
	if err := <-first; err != nil {
		t.Errorf("the held query: %v", err)
	}
	// The held query's token goes back just after its answer: retry.
	for deadline := time.Now().Add(5 * time.Second); ; {
		r, _, err := c.Exchange(m, h.addr)
		if err == nil {
			check(t, "after", show(r), "NOERROR")
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no answer after the held query returned: %v", err)
		}
	}
}

// TestServeListenerFails: a listener that fails under Serve stops it with
// that error (the supervisor restarts the proxy); it does not hang.
func TestServeListenerFails(t *testing.T) {
	p, err := New(Config{Listen: "127.0.0.1:0", Pool: testPool, Upstreams: []string{"127.0.0.1:1"}, Allower: &recorder{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Listen(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Serve(context.Background()) }()
	h := &harness{p: p, addr: p.Addr().String()}
	check(t, "serving", show(h.query(t, "udp", src1, "www.example.com.", dns.TypeA)), "REFUSED")
	p.lmu.Lock()
	p.udp.Close()
	p.lmu.Unlock()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "dns proxy: serve") {
			t.Errorf("Serve after its udp listener failed: %v, want the listener's error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after its udp listener failed")
	}
	if l, err := net.Listen("tcp", h.addr); err != nil {
		t.Errorf("tcp port not released: %v", err)
	} else {
		l.Close()
	}
}

// clock is a settable Config.Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// TestQueryRateLimit: a sandbox's flood beyond its burst is answered
// REFUSED with an Extended DNS Error and asks no upstream; another
// sandbox is not affected; the bucket refills with time.
func TestQueryRateLimit(t *testing.T) {
	clk := &clock{t: time.Unix(1_000_000, 0)}
	h := start(t, func(c *Config) { c.QueryRate = 1; c.QueryBurst = 5; c.Now = clk.now })
	o, eff := sandbox(t, "other", 2, testPolicy, true)
	h.p.Register(o, eff)
	const limited = `REFUSED | ede 0 "ctld network policy: query rate limit"`
	var got []string
	for range 20 {
		got = append(got, show(h.query(t, "udp", src1, "www.example.com.", dns.TypeA)))
	}
	ok := "NOERROR | www.example.com. 300 A 203.0.113.10 | www.example.com. 300 A 203.0.113.11"
	want := slices.Repeat([]string{ok}, 5)
	want = append(want, slices.Repeat([]string{limited}, 15)...)
	checkList(t, "flood", got, want)
	if n := len(h.up.queries()); n != 5 {
		t.Errorf("the upstream saw %d queries, want the 5 within the burst", n)
	}
	check(t, "other sandbox", show(h.query(t, "udp", src2, "www.example.com.", dns.TypeA)), ok)
	check(t, "tcp too", show(h.query(t, "tcp", src1, "www.example.com.", dns.TypeA)), limited)
	clk.add(2 * time.Second)
	check(t, "refilled 1", show(h.query(t, "udp", src1, "www.example.com.", dns.TypeA)), ok)
	check(t, "refilled 2", show(h.query(t, "udp", src1, "www.example.com.", dns.TypeA)), ok)
	check(t, "empty again", show(h.query(t, "udp", src1, "www.example.com.", dns.TypeA)), limited)
}

// TestAddressCapFlood: random names under an allowed wildcard, each
// answering 32 new addresses, fill the sandbox's cap; past it an answer
// is SERVFAIL and the set writer gets nothing more, while names whose
// addresses are kept still resolve, another sandbox is not affected, and
// expired addresses make room again.
func TestAddressCapFlood(t *testing.T) {
	clk := &clock{t: time.Unix(1_000_000, 0)}
	h := start(t, func(c *Config) { c.MaxAddrsPerSandbox = 64; c.QueryBurst = 1000; c.Now = clk.now })
	h.up.mu.Lock()
	for i := range 40 {
		var rrs []string
		for j := range MaxAddrs {
			rrs = append(rrs, fmt.Sprintf("r%d.example.com. 300 IN A 198.18.%d.%d", i, i, j+1))
		}
		h.up.zone[fmt.Sprintf("r%d.example.com. A", i)] = rrs
	}
	h.up.mu.Unlock()
	const capped = `SERVFAIL | ede 0 "ctld network policy: cap of resolved addresses reached (64)"`
	rcodes := map[string]int{}
	for i := range 40 {
		r := h.query(t, "udp", src1, fmt.Sprintf("r%d.example.com.", i), dns.TypeA)
		rcodes[dns.RcodeToString[r.Rcode]]++
		if i >= 2 {
			check(t, fmt.Sprintf("r%d", i), show(r), capped)
		}
	}
	if rcodes["NOERROR"] != 2 || rcodes["SERVFAIL"] != 38 {
		t.Errorf("rcodes %v, want 2 NOERROR (64 addresses), 38 SERVFAIL", rcodes)
	}
	h.allow.mu.Lock()
	calls := h.allow.calls
	h.allow.calls = nil
	h.allow.mu.Unlock()
	added := map[netip.Addr]bool{}
	for _, c := range calls {
		for _, a := range c.addrs {
			added[a] = true
		}
	}
	if len(added) != 64 || len(calls) != 2 {
		t.Errorf("the set writer got %d calls, %d addresses; want 2 calls, 64", len(calls), len(added))
	}
	// A minute later, a name whose addresses are kept refreshes them.
	clk.add(time.Minute)
	if r := h.query(t, "udp", src1, "r0.example.com.", dns.TypeA); r.Rcode != dns.RcodeSuccess || len(r.Answer) != MaxAddrs {
		t.Errorf("kept name: %s", show(r))
	}
	if n := len(h.allow.take()); n != 1 {
		t.Errorf("refresh of kept addresses: %d set writer calls, want 1", n)
	}
	o, eff := sandbox(t, "other", 2, testPolicy, true)
	h.p.Register(o, eff)
	if r := h.query(t, "udp", src2, "r5.example.com.", dns.TypeA); r.Rcode != dns.RcodeSuccess {
		t.Errorf("other sandbox: %s", show(r))
	}
	// r1's elements expire 5m30s after their answer; r0's were renewed
	// a minute later and stay: room for one more answer.
	clk.add(4*time.Minute + 31*time.Second)
	if r := h.query(t, "udp", src1, "r9.example.com.", dns.TypeA); r.Rcode != dns.RcodeSuccess {
		t.Errorf("after expiry: %s", show(r))
	}
	check(t, "full again", show(h.query(t, "udp", src1, "r10.example.com.", dns.TypeA)), capped)
}
