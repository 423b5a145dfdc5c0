package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/miekg/dns"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/netpolicy"
)

// Domain rules end to end: a DNS server of the test's own (in a test
// host's netns) is ctld's only upstream, its names answer with addresses
// of the test host; a runsc guest resolves through the node's DNS proxy
// (the resolv.conf ctld binds into it names its gateway) and connects
// with busybox nc.

// dnsTTL is the TTL of every answer of the test's DNS server: short, so
// the set elements expire within the test (the proxy clamps it up to
// the --dns-element-min-ttl floor and adds --dns-element-grace).
const dnsTTL = 2

// dnsQuery is one query the test's DNS server received.
type dnsQuery struct {
	Name string // lower case, fully qualified
	At   time.Time
}

// testDNS is an authoritative server for the test's names: exact names
// and every name strictly below a suffix answer one A record each; AAAA
// gets NODATA, anything else NXDOMAIN. It records every query.
type testDNS struct {
	Addr   netip.AddrPort
	exact  map[string]netip.Addr // "api.e2e.test."
	suffix map[string]netip.Addr // ".cdn.e2e.test."

	mu      sync.Mutex
	queries []dnsQuery
}

// startTestDNS serves names on port 53 of the test host's Addr4, inside
// its netns (so ctld reaches it like a resolver beyond the node).
func startTestDNS(t *testing.T, host *ktest.TestHost, exact, suffix map[string]netip.Addr) *testDNS {
	t.Helper()
	s := &testDNS{Addr: netip.AddrPortFrom(host.Addr4, 53), exact: map[string]netip.Addr{}, suffix: map[string]netip.Addr{}}
	for n, a := range exact {
		s.exact[dns.CanonicalName(n)] = a
	}
	for n, a := range suffix {
		s.suffix["."+dns.CanonicalName(n)] = a
	}
	var pc net.PacketConn
	var ln net.Listener
	if err := host.Netns.Do(func() (err error) {
		if pc, err = net.ListenPacket("udp", s.Addr.String()); err != nil {
			return err
		}
		ln, err = net.Listen("tcp", s.Addr.String())
		return err
	}); err != nil {
		t.Fatalf("test DNS server on %v: %v", s.Addr, err)
	}
	h := dns.HandlerFunc(s.serve)
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: ln, Handler: h}} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		done := make(chan error, 1)
		go func() { done <- srv.ActivateAndServe() }()
		select {
		case <-started:
		case err := <-done:
			t.Fatalf("test DNS server: %v", err)
		}
		t.Cleanup(func() {
			_ = srv.Shutdown()
			<-done
		})
	}
	return s
}

func (s *testDNS) serve(w dns.ResponseWriter, req *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	if len(req.Question) != 1 {
		m.Rcode = dns.RcodeFormatError
		_ = w.WriteMsg(m)
		return
	}
	q := req.Question[0]
	name := dns.CanonicalName(q.Name)
	s.mu.Lock()
	s.queries = append(s.queries, dnsQuery{Name: name, At: time.Now()})
	s.mu.Unlock()
	a, ok := s.exact[name]
	for suf, sa := range s.suffix {
		if !ok && strings.HasSuffix(name, suf) {
			a, ok = sa, true
		}
	}
	switch {
	case !ok:
		m.Rcode = dns.RcodeNameError
	case q.Qtype == dns.TypeA:
		m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: dnsTTL}, A: a.AsSlice()})
	}
	_ = w.WriteMsg(m)
}

// Queries returns the queries received so far.
func (s *testDNS) Queries() []dnsQuery {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.queries)
}

// asked reports whether name was ever queried.
func (s *testDNS) asked(name string) bool {
	return slices.ContainsFunc(s.Queries(), func(q dnsQuery) bool { return q.Name == dns.CanonicalName(name) })
}

// offsetAddr is a with its third byte moved by d: an address of the test
// host's own (198.19.x.y, derived from its Other4) that no other test
// host claims (those use 198.19.0-3.x).
func offsetAddr(a netip.Addr, d byte) netip.Addr {
	b := a.As4()
	b[2] += d
	return netip.AddrFrom4(b)
}

// guestExec runs a shell script in sandbox id and returns its output;
// a failure to run it (not a non-zero exit) fails the test.
func (e *env) guestExec(cx context.Context, id, script string) string {
	e.t.Helper()
	r, err := e.client().Exec(cx, id, api.ExecRequest{Args: []string{"/bin/sh", "-c", script}})
	if err != nil {
		e.t.Fatalf("exec in %s: %v\nscript:\n%s", id, err, script)
	}
	return string(r.Stdout) + string(r.Stderr)
}

// checkNodeResolver checks the resolv.conf ctld gave the guest: it names
// only the guest's gateway (its default route), where the node redirects
// port 53 to its DNS proxy, and the guest cannot write it.
func (e *env) checkNodeResolver(cx context.Context, id string) {
	e.t.Helper()
	// Shell builtins but for ip: a guest under ptrace and TCG starts a
	// process in seconds when the machine is busy.
	out := e.guestExec(cx, id, `set -- $(ip -4 route show default); echo "gateway $3"
while IFS= read -r l; do case "$l" in nameserver*) echo "$l";; esac; done < /etc/resolv.conf
if (echo "nameserver 192.0.2.53" >> /etc/resolv.conf) 2>/dev/null; then echo writable; else echo read-only; fi`)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	gw, ok := strings.CutPrefix(lines[0], "gateway ")
	if !ok || gw == "" || len(lines) != 3 || lines[1] != "nameserver "+gw || lines[2] != "read-only" {
		e.t.Fatalf("the guest's /etc/resolv.conf in %s: want only \"nameserver <its gateway>\", read-only; got:\n%s", id, out)
	}
}

// lookupResult is what busybox nslookup in the guest said about a name.
type lookupResult struct {
	Addrs   []netip.Addr
	Refused bool
	Out     string
}

var nslookupAddr = regexp.MustCompile(`(?m)^Address(?: \d+)?:\s+(\S+)$`)

// lookup resolves names in the guest (in parallel) through its
// resolv.conf: one nslookup process each, read back with builtins.
func (e *env) lookup(cx context.Context, id string, names ...string) map[string]lookupResult {
	e.t.Helper()
	var script strings.Builder
	for i, n := range names {
		fmt.Fprintf(&script, "nslookup -type=a %s > /tmp/ns%d 2>&1 &\n", n, i)
	}
	script.WriteString("wait\n")
	for i, n := range names {
		fmt.Fprintf(&script, "echo '=== %s'; while IFS= read -r l; do echo \"$l\"; done < /tmp/ns%d\n", n, i)
	}
	out := e.guestExec(cx, id, script.String())
	res := map[string]lookupResult{}
	for _, part := range strings.Split(out, "=== ")[1:] {
		n, body, _ := strings.Cut(part, "\n")
		r := lookupResult{Out: body, Refused: strings.Contains(body, "REFUSED")}
		// The server's own "Address: <gw>:53" line does not parse.
		for _, m := range nslookupAddr.FindAllStringSubmatch(body, -1) {
			if a, err := netip.ParseAddr(m[1]); err == nil {
				r.Addrs = append(r.Addrs, a)
			}
		}
		res[n] = r
	}
	for _, n := range names {
		if _, ok := res[n]; !ok {
			e.t.Fatalf("nslookup %s in %s: no output in %q", n, id, out)
		}
	}
	return res
}

// connectWait is how long a guest's nc waits for a connection: an
// allowed one may take seconds to start and connect in a starved guest.
const connectWait = 10

// connect tries a TCP connection from the guest to port 8080 of each
// address at once (one nc each, which closes at once) and says which the
// test host accepted. It returns when every nc ended, so a connection
// not accepted by then was not let through. A blocked result proves
// something only if the attempt left the guest: the sandbox's drop
// counter must have grown by at least one packet per blocked address.
func (e *env) connect(cx context.Context, id string, host *ktest.TestHost, addrs ...netip.Addr) map[netip.Addr]bool {
	e.t.Helper()
	before := map[netip.Addr]int{}
	for _, a := range addrs {
		before[a] = hostHits(host, a)
	}
	dropped0 := e.dropped(cx, id)
	var script strings.Builder
	for _, a := range addrs {
		fmt.Fprintf(&script, "nc -w %d %s 8080 < /dev/null > /dev/null 2>&1 &\n", connectWait, a)
	}
	script.WriteString("wait\n")
	e.guestExec(cx, id, script.String())
	got := map[netip.Addr]bool{}
	blocked := 0
	for _, a := range addrs {
		got[a] = hostHits(host, a) > before[a]
		if !got[a] {
			blocked++
		}
	}
	if d := e.dropped(cx, id) - dropped0; d < uint64(blocked) {
		e.t.Fatalf("connections from %s: %d blocked (%v) but the sandbox dropped %d packets meanwhile: the attempts did not leave the guest", id, blocked, got, d)
	}
	e.t.Logf("connections from %s (true: accepted by the test host): %v", id, got)
	return got
}

// dropped is the sandbox's drop counter.
func (e *env) dropped(cx context.Context, id string) uint64 {
	e.t.Helper()
	sb, err := e.client().Get(cx, id)
	if err != nil || sb.Network == nil {
		e.t.Fatalf("network status of %s: %+v, %v", id, sb.Network, err)
	}
	return sb.Network.DroppedPackets
}

// hostHits counts the TCP connections the test host accepted on a.
func hostHits(h *ktest.TestHost, a netip.Addr) int {
	n := 0
	for _, x := range h.Hits() {
		if x.Proto == "tcp" && x.Local.Addr() == a {
			n++
		}
	}
	return n
}

// domainElements returns the IPv4 addresses now in the domain sets of
// generation gen of sandbox id (the kernel leaves expired elements out
// of a listing).
func domainElements(t testing.TB, table, id string, gen uint64) []netip.Addr {
	t.Helper()
	var out []netip.Addr
	for _, el := range domainSetElements(t, table, id, gen) {
		out = append(out, el.Addr)
	}
	return out
}

// setElement is an element of a domain set and its timeout.
type setElement struct {
	Addr    netip.Addr
	Timeout time.Duration
}

// domainSetElements is domainElements with each element's timeout.
func domainSetElements(t testing.TB, table, id string, gen uint64) []setElement {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tab := &nftables.Table{Name: table, Family: nftables.TableFamilyINet}
	sets, err := c.GetSets(tab)
	if err != nil {
		t.Fatalf("list sets of %s: %v", table, err)
	}
	prefix := netpolicy.SetName(id, gen, "d")
	var out []setElement
	for _, s := range sets {
		if !strings.HasPrefix(s.Name, prefix) || !strings.HasSuffix(s.Name, "-4") {
			continue
		}
		els, err := c.GetSetElements(s)
		if err != nil {
			t.Fatalf("elements of %s: %v", s.Name, err)
		}
		for _, el := range els {
			if a, ok := netip.AddrFromSlice(el.Key); ok {
				out = append(out, setElement{Addr: a, Timeout: el.Timeout})
			}
		}
	}
	slices.SortFunc(out, func(a, b setElement) int { return a.Addr.Compare(b.Addr) })
	return out
}

// dnsPolicy allows tcp 8080 to api.e2e.test and every name below
// cdn.e2e.test, plus the CIDR rules given.
func dnsPolicy(cidrs ...string) api.NetworkPolicy {
	p := api.NetworkPolicy{Mode: api.NetworkRestrict, Rules: []api.NetworkRule{
		{Domain: "api.e2e.test", Protocol: "tcp", Ports: []string{"8080"}},
		{Domain: "*.cdn.e2e.test", Protocol: "tcp", Ports: []string{"8080"}},
	}}
	for _, c := range cidrs {
		p.Rules = append(p.Rules, api.NetworkRule{CIDR: c, Protocol: "tcp", Ports: []string{"8080"}})
	}
	return p
}

// dnsSetup is a test host with the test's names and a DNS server
// answering them, and its addresses: api.e2e.test → API,
// *.cdn.e2e.test → CDN, evil.e2e.test → Evil (a name no policy allows),
// cdn.e2e.test → Bare (the suffix itself, not strictly below it).
type dnsSetup struct {
	Host                 *ktest.TestHost
	DNS                  *testDNS
	API, CDN, Evil, Bare netip.Addr
}

func newDNSSetup(t *testing.T) dnsSetup {
	host := ktest.NewTestHost(t, ktest.TestHostOptions{UDP: []uint16{}})
	s := dnsSetup{Host: host, API: host.Other4, CDN: offsetAddr(host.Other4, 100), Evil: offsetAddr(host.Other4, 101), Bare: offsetAddr(host.Other4, 102)}
	for _, a := range []netip.Addr{s.CDN, s.Evil, s.Bare} {
		host.AddAddr(t, a)
	}
	s.DNS = startTestDNS(t, host, map[string]netip.Addr{"api.e2e.test": s.API, "evil.e2e.test": s.Evil, "cdn.e2e.test": s.Bare},
		map[string]netip.Addr{"cdn.e2e.test": s.CDN})
	// Positive controls: the node itself reaches every destination, and
	// the server answers.
	controls := []netip.Addr{s.API, s.CDN, s.Evil, s.Bare, host.Addr4}
	for _, a := range controls {
		conn, err := net.DialTimeout("tcp", netip.AddrPortFrom(a, 8080).String(), 3*time.Second)
		if err != nil {
			t.Fatalf("the node itself cannot reach %v:8080: %v", a, err)
		}
		conn.Close()
	}
	// The host records a connection when its server accepts it, which
	// can come after the dial returned: a test's count taken after this
	// (a guest must add nothing to the denied address's) holds them all.
	waitFor(t, 30*time.Second, "the test host to record the node's control connections", func() bool {
		for _, a := range controls {
			if hostHits(host, a) < 1 {
				return false
			}
		}
		return true
	}, func() string { return fmt.Sprintf("hits %v", host.Hits()) })
	m := new(dns.Msg)
	m.SetQuestion("x.cdn.e2e.test.", dns.TypeA)
	r, err := dns.Exchange(m, s.DNS.Addr.String())
	if err != nil || len(r.Answer) != 1 {
		t.Fatalf("the test DNS server does not answer the node: %v, %v", r, err)
	}
	return s
}

// domainRulesFloor and domainRulesGrace are TestNetworkDomainRules'
// --dns-element-min-ttl and --dns-element-grace.
const (
	domainRulesFloor = 90 * time.Second
	domainRulesGrace = time.Second
)

// TestNetworkDomainRules: a restricted guest with two domain rules (an
// exact name and *.suffix) resolves through the node's proxy and reaches
// what the answers name, and nothing before; a name not allowed (and the
// suffix itself) is REFUSED without reaching the upstream, and its address
// stays closed; an address of the same test host that no allowed name
// answered is denied; after TTL + grace the elements leave the nft set and
// new connections to them fail, until the name is resolved again.
func TestNetworkDomainRules(t *testing.T) {
	e := newEnv(t)
	s := newDNSSetup(t)
	// The elements must outlive one guest exec after the lookup (the
	// connections): with the default 35 s a starved guest under TCG
	// connected only after they expired. Both settings are ctld's.
	e.args = append(e.args, "--dns-upstream", s.DNS.Addr.String(),
		"--dns-element-min-ttl", domainRulesFloor.String(), "--dns-element-grace", domainRulesGrace.String())
	e.start("a")
	e.waitPrimary("a", 60*time.Second)
	c := e.client()
	cx := ctx(t, 10*time.Minute)
	t0 := time.Now()

	req := claimReq("claim-dns", 1)
	req.Resources.PIDs, req.Resources.MemoryBytes = 1024, 512<<20
	req.Network = dnsPolicy()
	if _, err := c.Claim(cx, "dns", req); err != nil {
		t.Fatalf("claim: %v", err)
	}
	claimed := time.Now()
	e.checkNodeResolver(cx, "dns")

	// Nothing is open before a name is resolved.
	all := []netip.Addr{s.API, s.CDN, s.Evil, s.Bare, s.Host.Addr4}
	for a, ok := range e.connect(cx, "dns", s.Host, all...) {
		if ok {
			t.Errorf("before any lookup %v:8080 is reachable, want blocked", a)
		}
	}

	lookedUp := time.Now()
	got := e.lookup(cx, "dns", "api.e2e.test", "x.cdn.e2e.test", "evil.e2e.test", "cdn.e2e.test")
	resolved := time.Now()
	for name, want := range map[string]netip.Addr{"api.e2e.test": s.API, "x.cdn.e2e.test": s.CDN} {
		if r := got[name]; !slices.Equal(r.Addrs, []netip.Addr{want}) || r.Refused {
			t.Errorf("nslookup %s = %v (refused %v), want %v:\n%s", name, r.Addrs, r.Refused, want, r.Out)
		}
	}
	for _, name := range []string{"evil.e2e.test", "cdn.e2e.test"} {
		if r := got[name]; !r.Refused || len(r.Addrs) > 0 {
			t.Errorf("nslookup %s = %v (refused %v), want REFUSED:\n%s", name, r.Addrs, r.Refused, r.Out)
		}
		if s.DNS.asked(name) {
			t.Errorf("the proxy forwarded the refused name %s to the upstream", name)
		}
	}
	if els := domainElements(t, e.nftTable, "dns", 1); !slices.Equal(els, []netip.Addr{s.API, s.CDN}) {
		t.Errorf("domain set elements after the lookups = %v, want %v and %v", els, s.API, s.CDN)
	}

	evilHits, bareHits, addr4Hits := hostHits(s.Host, s.Evil), hostHits(s.Host, s.Bare), hostHits(s.Host, s.Host.Addr4)
	reach := e.connect(cx, "dns", s.Host, all...)
	for _, a := range []netip.Addr{s.API, s.CDN} {
		if !reach[a] {
			t.Errorf("%v (an answer of an allowed name) is blocked, want reachable", a)
		}
	}
	for _, a := range []netip.Addr{s.Evil, s.Bare, s.Host.Addr4} {
		if reach[a] {
			t.Errorf("%v (no answer of an allowed name) is reachable, want blocked", a)
		}
	}
	if evilHits != hostHits(s.Host, s.Evil) || bareHits != hostHits(s.Host, s.Bare) || addr4Hits != hostHits(s.Host, s.Host.Addr4) {
		t.Errorf("a denied address of the test host accepted a connection from the guest: %v", s.Host.Hits())
	}
	opened := time.Now()

	// Expiry: the proxy put each answer in with a timeout of TTL
	// (clamped up to the floor) + the grace; the kernel drops it then.
	life := max(dnsTTL*time.Second, domainRulesFloor) + domainRulesGrace
	deadline := resolved.Add(life + 20*time.Second)
	for len(domainElements(t, e.nftTable, "dns", 1)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("domain set elements %v still there %v after the lookups (element timeout %v)",
				domainElements(t, e.nftTable, "dns", 1), time.Since(resolved).Round(time.Second), life)
		}
		time.Sleep(250 * time.Millisecond)
	}
	expired := time.Now()
	// The elements were added after the lookups began: they may not go
	// before their timeout.
	if lived := expired.Sub(lookedUp); lived < life {
		t.Errorf("domain set elements gone %v after the lookups began, before their timeout %v", lived.Round(time.Millisecond), life)
	}
	apiHits := hostHits(s.Host, s.API)
	for a, ok := range e.connect(cx, "dns", s.Host, s.API, s.CDN) {
		if ok {
			t.Errorf("%v is reachable after its set element expired, want blocked", a)
		}
	}
	if hostHits(s.Host, s.API) != apiHits {
		t.Errorf("the test host accepted a connection to %v after the element expired", s.API)
	}

	// Resolving again opens it again.
	if r := e.lookup(cx, "dns", "api.e2e.test")["api.e2e.test"]; !slices.Equal(r.Addrs, []netip.Addr{s.API}) {
		t.Fatalf("nslookup api.e2e.test after expiry = %v:\n%s", r.Addrs, r.Out)
	}
	if !e.connect(cx, "dns", s.Host, s.API)[s.API] {
		t.Errorf("%v is blocked after api.e2e.test was resolved again, want reachable", s.API)
	}
	t.Logf("guest seconds: claim %.1fs, lookups and connections %.1fs, wait for expiry %.1fs (element timeout %v, gone %.1fs after the lookups), after expiry %.1fs; total %.1fs",
		claimed.Sub(t0).Seconds(), opened.Sub(claimed).Seconds(), expired.Sub(opened).Seconds(), life, expired.Sub(resolved).Seconds(),
		time.Since(expired).Seconds(), time.Since(t0).Seconds())

	rel, err := c.Release(cx, "dns", api.ReleaseRequest{OperationID: "release-dns", Generation: 1})
	if err != nil {
		t.Fatalf("release: %v", err)
	}
	if !rel.Proof.Clean {
		t.Errorf("proof not clean: %+v", rel.Proof.Checks)
	}
}
