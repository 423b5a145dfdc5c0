package netpolicy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// testFacts: a node with a public and a private uplink address and IPv6,
// holding slot 1 of its pool.
func testFacts(t *testing.T, v6 bool) Facts {
	t.Helper()
	pool := Pool{V4: pfx("10.200.0.0/16")}
	nodeAddrs := []netip.Addr{ip("198.51.100.10"), ip("10.0.0.5"), ip("127.0.0.1"), {}} // a zero address is skipped
	if v6 {
		pool.V6 = pfx("fd00:c71d::/64")
		nodeAddrs = append(nodeAddrs, ip("2001:db8::10"), ip("fe80::1"))
	}
	if err := pool.Check(); err != nil {
		t.Fatal(err)
	}
	b, err := pool.Block(1)
	if err != nil {
		t.Fatal(err)
	}
	return Facts{Pool: pool, Block: b, NodeAddrs: nodeAddrs}
}

func mustParse(t *testing.T, s Spec) Policy {
	t.Helper()
	p, err := ParseDefault("network", s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// allows reports whether e's allow sets take a packet to dst, as the
// kernel's set lookup would.
func allows(e Effective, dst netip.Addr, proto Proto, port uint16) bool {
	set := e.Allow4
	if dst.Is6() {
		set = e.Allow6
	}
	for _, el := range set {
		if el.Dst.Contains(dst) && el.Proto == proto && el.Ports.From <= port && port <= el.Ports.To {
			return true
		}
	}
	return false
}

func TestResolveDenyAll(t *testing.T) {
	e := Resolve(mustParse(t, Spec{}), testFacts(t, true))
	want := "mode deny_all\nsource 10.200.0.3 fd00:c71d::6\n"
	if got := e.String(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

// TestResolveRestricted: the whole effective policy of a typical allowlist,
// as text.
func TestResolveRestricted(t *testing.T) {
	p := mustParse(t, Spec{Mode: "restricted", Rules: []RuleSpec{
		{CIDR: "203.0.113.0/24"},
		{CIDR: "203.0.113.128/25", Protocol: "udp", Ports: []string{"53"}},
		{CIDR: "10.1.0.0/16", Protocol: "tcp", Ports: []string{"5432"}},
		{CIDR: "169.254.169.254", Protocol: "tcp", Ports: []string{"80"}},
		{CIDR: "0.0.0.0/0", Protocol: "tcp", Ports: []string{"443"}},
		{CIDR: "2001:db8:1::/48", Protocol: "tcp", Ports: []string{"22"}},
		{Domain: "*.example.com", Protocol: "tcp", Ports: []string{"443"}},
		{Domain: "api.github.com", Protocol: "tcp", Ports: []string{"443"}},
		{Domain: "pypi.org"},
	}})
	e := Resolve(p, testFacts(t, true))
	want := `mode restricted
source 10.200.0.3 fd00:c71d::6
dns proxy 10.200.0.2 fd00:c71d::5
allow 1.0.0.0-9.255.255.255 tcp 443
allow 10.1.0.0/16 tcp 5432
allow 11.0.0.0-100.63.255.255 tcp 443
allow 100.128.0.0-126.255.255.255 tcp 443
allow 128.0.0.0-169.253.255.255 tcp 443
allow 169.254.169.254 tcp 80
allow 169.255.0.0-172.15.255.255 tcp 443
allow 172.32.0.0-192.167.255.255 tcp 443
allow 192.169.0.0-198.51.100.9 tcp 443
allow 198.51.100.11-203.0.112.255 tcp 443
allow 203.0.113.0/25 tcp 0-52
allow 203.0.113.0/25 tcp 54-852
allow 203.0.113.0/25 tcp 854-65535
allow 203.0.113.0/25 udp 0-52
allow 203.0.113.0/25 udp 54-65535
allow 203.0.113.128/25 tcp 0-52
allow 203.0.113.128/25 tcp 54-852
allow 203.0.113.128/25 tcp 854-65535
allow 203.0.113.128/25 udp 0-65535
allow 203.0.114.0-223.255.255.255 tcp 443
allow 2001:db8:1::/48 tcp 22
deny 0.0.0.0/8
deny 10.0.0.0/16
deny 10.2.0.0-10.255.255.255
deny 100.64.0.0/10
deny 127.0.0.0/8
deny 169.254.0.0-169.254.169.253
deny 169.254.169.255-169.254.255.255
deny 172.16.0.0/12
deny 192.168.0.0/16
deny 198.51.100.10
deny 224.0.0.0/3
deny ::/127
deny ::ffff:0.0.0.0/96
deny 64:ff9b::/96
deny 64:ff9b:1::/48
deny 2001:db8::10
deny 2002::/16
deny fc00::/7
deny fe80::/10
deny ff00::/8
domains tcp [0-52 54-852 854-65535] pypi.org
domains tcp [443] *.example.com,api.github.com
domains udp [0-52 54-65535] pypi.org
`
	if got := e.String(); got != want {
		t.Errorf("got\n%s\nwant\n%s\ndiff: %s", got, want, lineDiff(got, want))
	}
}

func lineDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	var out []string
	for _, l := range g {
		if !slices.Contains(w, l) {
			out = append(out, "+"+l)
		}
	}
	for _, l := range w {
		if !slices.Contains(g, l) {
			out = append(out, "-"+l)
		}
	}
	return strings.Join(out, " ")
}

// TestResolveNeverReachable: the reserved ranges in open mode, and what a
// rule that names them opens.
func TestResolveNeverReachable(t *testing.T) {
	f := testFacts(t, true)
	open := Resolve(mustParse(t, Spec{Mode: "open"}), f)
	closedDst := []string{
		"169.254.169.254", "fd00:ec2::254", // metadata
		"198.51.100.10", "10.0.0.5", "2001:db8::10", "127.0.0.1", "::1", "fe80::1", // the node
		"10.200.0.2", "10.200.0.5", "fd00:c71d::9", // gateways and other sandboxes
		"10.1.2.3", "172.16.0.1", "192.168.1.1", "100.64.0.1", "fd12::1", // private
		"224.0.0.1", "255.255.255.255", "ff02::1", "0.0.0.1", "::",
		// IPv4 inside IPv6: metadata and RFC 1918 through NAT64, 6to4, mapped.
		"64:ff9b::a9fe:a9fe", "64:ff9b::a00:1", "64:ff9b:1::a9fe:a9fe", "64:ff9b:1:ffff::1",
		"2002:a9fe:a9fe::1", "2002::1", "::ffff:169.254.169.254", "::ffff:8.8.8.8",
	}
	for _, d := range closedDst {
		for _, proto := range []Proto{ProtoTCP, ProtoUDP} {
			if allows(open, ip(d), proto, 443) {
				t.Errorf("open allows %s %s", d, proto)
			}
		}
	}
	for _, d := range []string{"8.8.8.8", "1.1.1.1", "203.0.113.9", "2001:4860::8888", "198.51.100.11", "2001:db8::11"} {
		if !allows(open, ip(d), ProtoTCP, 443) || !allows(open, ip(d), ProtoUDP, 53) {
			t.Errorf("open does not allow %s", d)
		}
	}
	if !open.OtherDNS || !allows(open, ip("8.8.8.8"), ProtoTCP, 853) {
		t.Error("open mode closes other resolvers")
	}

	// Rules that lie inside a reserved range open exactly it; the node
	// stays closed even inside an opened private range.
	named := Resolve(mustParse(t, Spec{Mode: "open", Rules: []RuleSpec{
		{CIDR: "10.0.0.0/8"}, {CIDR: "169.254.169.254"}, {CIDR: "10.200.0.5"}, {CIDR: "fd00:ec2::254"},
		{CIDR: "198.51.100.10"}, {CIDR: "127.0.0.0/8"}, {CIDR: "64:ff9b::808:808/128"},
	}}), f)
	for _, d := range []string{"10.1.2.3", "10.0.0.4", "169.254.169.254", "10.200.0.5", "fd00:ec2::254", "64:ff9b::808:808"} {
		if !allows(named, ip(d), ProtoTCP, 80) {
			t.Errorf("named rule does not open %s", d)
		}
	}
	if fmt.Sprint(named.Ignored) != "[127.0.0.0/8 198.51.100.10/32]" {
		t.Errorf("ignored = %v, want the loopback and node address rules", named.Ignored)
	}
	for _, d := range []string{"10.0.0.5", "198.51.100.10", "127.0.0.1", "10.200.0.7", "169.254.169.253", "fd00:ec2::253", "fd00:c71d::6", "64:ff9b::a9fe:a9fe"} {
		if allows(named, ip(d), ProtoTCP, 80) {
			t.Errorf("opens %s, which no rule names (or is the node)", d)
		}
	}
	// A wider rule does not open the ranges inside it.
	wide := Resolve(mustParse(t, Spec{Mode: "restricted", Rules: []RuleSpec{{CIDR: "169.254.0.0/15"}, {CIDR: "fc00::/6"}, {CIDR: "::/1"}}}), f)
	for _, d := range []string{"169.254.169.254", "fd00:ec2::254", "fd12::1", "64:ff9b::a9fe:a9fe", "2002:a9fe:a9fe::1"} {
		if allows(wide, ip(d), ProtoTCP, 80) {
			t.Errorf("a wider rule opens %s", d)
		}
	}
	if !allows(wide, ip("169.255.0.1"), ProtoTCP, 80) || !allows(wide, ip("fe00::1"), ProtoTCP, 80) {
		t.Error("a wider rule does not open its public part")
	}
}

// TestResolveDNSPorts: in restricted mode a rule without ports does not
// open DNS or DoT to another resolver; a rule that lists the port does.
func TestResolveDNSPorts(t *testing.T) {
	f := testFacts(t, true)
	e := Resolve(mustParse(t, Spec{Mode: "restricted", Rules: []RuleSpec{
		{CIDR: "8.8.8.8"}, {CIDR: "1.1.1.1", Protocol: "udp", Ports: []string{"53"}}, {CIDR: "9.9.9.9", Ports: []string{"1-65535"}},
	}}), f)
	for _, c := range []struct {
		dst   string
		proto Proto
		port  uint16
		want  bool
	}{
		{"8.8.8.8", ProtoUDP, 53, false}, {"8.8.8.8", ProtoTCP, 53, false}, {"8.8.8.8", ProtoTCP, 853, false},
		{"8.8.8.8", ProtoUDP, 853, true}, {"8.8.8.8", ProtoTCP, 443, true}, {"8.8.8.8", ProtoTCP, 52, true}, {"8.8.8.8", ProtoTCP, 54, true},
		{"1.1.1.1", ProtoUDP, 53, true}, {"1.1.1.1", ProtoTCP, 53, false},
		{"9.9.9.9", ProtoTCP, 853, true}, {"9.9.9.9", ProtoUDP, 53, true},
	} {
		if got := allows(e, ip(c.dst), c.proto, c.port); got != c.want {
			t.Errorf("%s %s %d: %v, want %v", c.dst, c.proto, c.port, got, c.want)
		}
	}
	if e.OtherDNS || e.DNS4 != f.Block.Gateway4 || e.DNS6 != f.Block.Gateway6 {
		t.Errorf("dns: other %v proxy %v %v", e.OtherDNS, e.DNS4, e.DNS6)
	}
}

// TestResolveNoIPv6: without an IPv6 pool the sandbox has no IPv6 source,
// nothing IPv6 is allowed, and IPv6 rules are reported as ignored.
func TestResolveNoIPv6(t *testing.T) {
	f := testFacts(t, false)
	e := Resolve(mustParse(t, Spec{Mode: "restricted", Rules: []RuleSpec{{CIDR: "2001:db8::/32"}, {CIDR: "203.0.113.0/24", Ports: []string{"80"}}}}), f)
	if e.Source6.IsValid() || e.DNS6.IsValid() || len(e.Allow6) != 0 || len(e.Deny6) != 0 {
		t.Errorf("IPv6 state without IPv6:\n%s", e)
	}
	if len(e.Ignored) != 1 || e.Ignored[0].CIDR != pfx("2001:db8::/32") {
		t.Errorf("ignored = %v", e.Ignored)
	}
	if !allows(e, ip("203.0.113.1"), ProtoTCP, 80) {
		t.Error("v4 rule lost")
	}
	open := Resolve(mustParse(t, Spec{Mode: "open"}), f)
	if len(open.Allow6) != 0 || len(open.Ignored) != 1 {
		t.Errorf("open without IPv6 allows IPv6:\n%s", open)
	}
}

// reference decides a packet straight from the policy's words, with no
// set arithmetic: the oracle for TestResolveMatchesReference.
func reference(p Policy, f Facts, reserved []Reserved, dst netip.Addr, proto Proto, port uint16) bool {
	if p.Mode == ModeDenyAll {
		return false
	}
	if dst.Is6() && !f.Pool.IPv6() {
		return false
	}
	rules := p.Rules
	if p.Mode == ModeOpen {
		rules = append([]Rule{{CIDR: pfx("0.0.0.0/0")}, {CIDR: pfx("::/0")}}, rules...)
	}
	for _, r := range rules {
		if r.IsDomain() || !r.CIDR.Contains(dst) || (r.Protocol != ProtoBoth && r.Protocol != proto) {
			continue
		}
		portOK := false
		if len(r.Ports) == 0 {
			portOK = p.Mode != ModeRestricted || !slices.Contains(dnsPorts[proto], port)
		}
		for _, pr := range r.Ports {
			portOK = portOK || pr.From <= port && port <= pr.To
		}
		if !portOK {
			continue
		}
		blocked := false
		for _, res := range reserved {
			if !res.Prefix.Contains(dst) {
				continue
			}
			inside := res.Prefix.Bits() <= r.CIDR.Bits() && res.Prefix.Contains(r.CIDR.Addr())
			if res.Tier == TierNever || !inside {
				blocked = true
			}
		}
		if !blocked {
			return true
		}
	}
	return false
}

// TestResolveMatchesReference: random policies over a small universe of
// overlapping ranges; at every range edge (and one past it) and a few
// ports, the sets agree with the reference, never overlap, and Deny holds
// no address the sets allow.
func TestResolveMatchesReference(t *testing.T) {
	cidrs := []string{"0.0.0.0/0", "10.0.0.0/8", "10.0.0.0/16", "10.200.0.0/24", "10.200.0.5/32", "169.254.0.0/16", "169.254.169.254/32",
		"203.0.113.0/24", "203.0.113.128/25", "198.51.100.0/24", "100.64.0.0/10", "172.16.0.0/12", "::/0", "fc00::/7", "fd00:ec2::254/128",
		"2001:db8::/32", "2001:db8::10/128", "fd00:c71d::/64", "fd00:c71d::8/126", "128.0.0.0/1",
		"64:ff9b::/96", "64:ff9b::a9fe:a9fe/128", "2002::/16", "2000::/3"}
	portSets := [][]string{nil, {"53"}, {"443"}, {"80-90", "443"}, {"1-1000"}, {"853"}}
	modes := []string{"open", "restricted"}
	seed := uint32(7)
	rnd := func(n int) int { seed = seed*1664525 + 1013904223; return int(seed>>8) % n }
	for _, v6 := range []bool{true, false} {
		f := testFacts(t, v6)
		var probes []netip.Addr
		for _, res := range ReservedRanges(f) {
			r := rangeOf(res.Prefix)
			probes = append(probes, r.From, r.To, r.From.Prev(), r.To.Next())
		}
		for _, c := range cidrs {
			r := rangeOf(pfx(c))
			probes = append(probes, r.From, r.To, r.From.Prev(), r.To.Next())
		}
		probes = slices.DeleteFunc(probes, func(a netip.Addr) bool { return !a.IsValid() })
		slices.SortFunc(probes, netip.Addr.Compare)
		probes = slices.Compact(probes)
		reserved := ReservedRanges(f)
		ports := []uint16{0, 52, 53, 54, 80, 90, 91, 443, 853, 1000, 1001, 65535}
		for i := 0; i < 150; i++ {
			spec := Spec{Mode: modes[rnd(2)]}
			for j := rnd(6); j > 0; j-- {
				spec.Rules = append(spec.Rules, RuleSpec{CIDR: cidrs[rnd(len(cidrs))], Protocol: []string{"", "tcp", "udp"}[rnd(3)], Ports: portSets[rnd(len(portSets))]})
			}
			p := mustParse(t, spec)
			e := Resolve(p, f)
			checkDisjoint(t, e.Allow4)
			checkDisjoint(t, e.Allow6)
			for _, dst := range probes {
				for _, port := range ports {
					for _, proto := range []Proto{ProtoTCP, ProtoUDP} {
						got, want := allows(e, dst, proto, port), reference(p, f, reserved, dst, proto, port)
						if got != want {
							t.Fatalf("v6 %v, policy %s: %v %s %d: sets say %v, reference %v\n%s", v6, render(p), dst, proto, port, got, want, e)
						}
					}
				}
				if allows(e, dst, ProtoTCP, 443) || allows(e, dst, ProtoUDP, 443) {
					for _, d := range append(slices.Clone(e.Deny4), e.Deny6...) {
						if d.Contains(dst) {
							t.Fatalf("policy %s: %v is allowed and in deny %v", render(p), dst, d)
						}
					}
				}
			}
		}
	}
}

// checkDisjoint: no two elements share an address, protocol and port: the
// kernel refuses overlapping elements of an interval set.
func checkDisjoint(t *testing.T, els []Element) {
	t.Helper()
	for i, a := range els {
		for _, b := range els[i+1:] {
			if a.Proto == b.Proto && a.Dst.From.Compare(b.Dst.To) <= 0 && b.Dst.From.Compare(a.Dst.To) <= 0 &&
				a.Ports.From <= b.Ports.To && b.Ports.From <= a.Ports.To {
				t.Fatalf("elements overlap: %v and %v", a, b)
			}
		}
	}
}

// TestResolveMerges: rules that cover neighbouring ranges with the same
// ports become one element, so the set size follows the policy's shape,
// not its wording.
func TestResolveMerges(t *testing.T) {
	f := testFacts(t, true)
	a := Resolve(mustParse(t, Spec{Mode: "restricted", Rules: []RuleSpec{
		{CIDR: "203.0.113.0/25", Protocol: "tcp", Ports: []string{"443"}}, {CIDR: "203.0.113.128/25", Protocol: "tcp", Ports: []string{"443"}}}}), f)
	b := Resolve(mustParse(t, Spec{Mode: "restricted", Rules: []RuleSpec{{CIDR: "203.0.113.0/24", Protocol: "tcp", Ports: []string{"443"}}}}), f)
	if fmt.Sprint(a.Allow4) != "[203.0.113.0/24 tcp 443]" || fmt.Sprint(a.Allow4) != fmt.Sprint(b.Allow4) {
		t.Errorf("halves %v, whole %v", a.Allow4, b.Allow4)
	}
}
