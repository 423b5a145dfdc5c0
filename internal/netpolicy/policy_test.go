package netpolicy

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/errdefs"
)

func cidrRule(c string, ports ...string) RuleSpec { return RuleSpec{CIDR: c, Ports: ports} }

// TestParseRefuses: every kind of bad policy is invalid_argument, and the
// message names the offending rule (index and text) and the reason.
func TestParseRefuses(t *testing.T) {
	long := strings.Repeat("a", 63)
	name254 := strings.Repeat(long+".", 4)[:250] + ".com" // 254 bytes
	manyRules := make([]RuleSpec, DefaultMaxRules+1)
	for i := range manyRules {
		manyRules[i] = cidrRule(fmt.Sprintf("203.0.%d.%d/32", i/256, i%256))
	}
	manyPorts := make([]string, DefaultMaxPorts+1)
	for i := range manyPorts {
		manyPorts[i] = fmt.Sprint(i + 1)
	}
	cases := []struct {
		name string
		spec Spec
		want []string // substrings of the message
	}{
		{"unknown mode", Spec{Mode: "allow"}, []string{`network.mode "allow"`}},
		{"mode case", Spec{Mode: "Open"}, []string{`network.mode "Open"`}},
		{"deny_all with rules", Spec{Mode: "deny_all", Rules: []RuleSpec{cidrRule("1.1.1.1")}}, []string{"takes no rules"}},
		{"empty mode with rules", Spec{Rules: []RuleSpec{cidrRule("1.1.1.1")}}, []string{"takes no rules"}},
		{"too many rules", Spec{Mode: "restricted", Rules: manyRules}, []string{"257 rules, more than 256"}},
		{"no destination", Spec{Mode: "restricted", Rules: []RuleSpec{{Protocol: "tcp"}}}, []string{"rules[0]", "names no destination"}},
		{"both", Spec{Mode: "restricted", Rules: []RuleSpec{{CIDR: "1.1.1.1", Domain: "a.com"}}}, []string{"rules[0]", "both cidr and domain"}},
		{"bad cidr octet", Spec{Mode: "restricted", Rules: []RuleSpec{cidrRule("1.1.1.1"), cidrRule("10.0.0.300/8")}}, []string{"rules[1]", `"10.0.0.300/8"`, "invalid cidr"}},
		{"bad cidr length", Spec{Mode: "restricted", Rules: []RuleSpec{cidrRule("10.0.0.0/33")}}, []string{"rules[0]", "invalid cidr"}},
		{"bad v6 length", Spec{Mode: "restricted", Rules: []RuleSpec{cidrRule("2001:db8::/129")}}, []string{"invalid cidr"}},
		{"cidr garbage", Spec{Mode: "restricted", Rules: []RuleSpec{cidrRule("example.com/24")}}, []string{"invalid cidr"}},
		{"cidr with space", Spec{Mode: "restricted", Rules: []RuleSpec{cidrRule(" 10.0.0.0/8")}}, []string{"invalid cidr"}},
		{"cidr zone", Spec{Mode: "restricted", Rules: []RuleSpec{cidrRule("fe80::1%eth0")}}, []string{"invalid cidr"}},
		{"cidr leading zero", Spec{Mode: "restricted", Rules: []RuleSpec{cidrRule("010.0.0.0/8")}}, []string{"invalid cidr"}},
		{"4in6", Spec{Mode: "restricted", Rules: []RuleSpec{cidrRule("::ffff:10.0.0.1/128")}}, []string{"IPv4-mapped"}},
		{"empty cidr length", Spec{Mode: "restricted", Rules: []RuleSpec{cidrRule("10.0.0.0/")}}, []string{"invalid cidr"}},
		{"name too long", Spec{Mode: "restricted", Rules: []RuleSpec{{Domain: name254}}}, []string{"254 bytes, more than 253"}},
		{"label too long", Spec{Mode: "restricted", Rules: []RuleSpec{{Domain: long + "a.com"}}}, []string{"64 bytes, more than 63"}},
		{"wildcard middle", Spec{Mode: "restricted", Rules: []RuleSpec{{Domain: "a.*.example.com"}}}, []string{"only as the whole first label"}},
		{"wildcard partial", Spec{Mode: "restricted", Rules: []RuleSpec{{Domain: "*foo.example.com"}}}, []string{"only as the whole first label"}},
		{"wildcard last", Spec{Mode: "restricted", Rules: []RuleSpec{{Domain: "example.*"}}}, []string{"only as the whole first label"}},
		{"double wildcard", Spec{Mode: "restricted", Rules: []RuleSpec{{Domain: "*.*.example.com"}}}, []string{"only as the whole first label"}},
		{"wildcard tld", Spec{Mode: "restricted", Rules: []RuleSpec{{Domain: "*.com"}}}, []string{"at least two labels"}},
		{"bare wildcard", Spec{Mode: "restricted", Rules: []RuleSpec{{Domain: "*"}}}, []string{"at least two labels"}},
		{"empty label", Spec{Mode: "restricted", Rules: []RuleSpec{{Domain: "a..com"}}}, []string{"empty label"}},
		{"leading dot", Spec{Mode: "restricted", Rules: []RuleSpec{{Domain: ".a.com"}}}, []string{"empty label"}},
		{"only dot", Spec{Mode: "restricted", Rules: []RuleSpec{{Domain: "."}}}, []string{"empty"}},
		{"hyphen", Spec{Mode: "restricted", Rules: []RuleSpec{{Domain: "-a.com"}}}, []string{"starts or ends with '-'"}},
		{"bad char", Spec{Mode: "restricted", Rules: []RuleSpec{{Domain: "a b.com"}}}, []string{"only letters"}},
		{"slash", Spec{Mode: "restricted", Rules: []RuleSpec{{Domain: "a.com/x"}}}, []string{"only letters"}},
		{"unicode", Spec{Mode: "restricted", Rules: []RuleSpec{{Domain: "bücher.de"}}}, []string{"xn--"}},
		// U+212A KELVIN SIGN lower-cases to an ASCII 'k': refused, not
		// silently turned into another name.
		{"kelvin sign", Spec{Mode: "restricted", Rules: []RuleSpec{{Domain: "\u212aexample.com"}}}, []string{"xn--"}},
		{"an address", Spec{Mode: "restricted", Rules: []RuleSpec{{Domain: "10.0.0.1"}}}, []string{"use cidr"}},
		{"numeric tld", Spec{Mode: "restricted", Rules: []RuleSpec{{Domain: "a.123"}}}, []string{"all digits"}},
		{"domain in open", Spec{Mode: "open", Rules: []RuleSpec{{Domain: "example.com"}}}, []string{"rules[0]", `needs mode "restricted"`}},
		{"protocol", Spec{Mode: "restricted", Rules: []RuleSpec{{CIDR: "1.1.1.1", Protocol: "icmp"}}}, []string{"unknown protocol \"icmp\""}},
		{"protocol case", Spec{Mode: "restricted", Rules: []RuleSpec{{CIDR: "1.1.1.1", Protocol: "TCP"}}}, []string{"unknown protocol"}},
		{"port 0", Spec{Mode: "restricted", Rules: []RuleSpec{cidrRule("1.1.1.1", "0")}}, []string{`invalid port "0"`}},
		{"port big", Spec{Mode: "restricted", Rules: []RuleSpec{cidrRule("1.1.1.1", "65536")}}, []string{`invalid port "65536"`}},
		{"port sign", Spec{Mode: "restricted", Rules: []RuleSpec{cidrRule("1.1.1.1", "+80")}}, []string{"invalid port"}},
		{"port hex", Spec{Mode: "restricted", Rules: []RuleSpec{cidrRule("1.1.1.1", "0x50")}}, []string{"invalid port"}},
		{"port empty", Spec{Mode: "restricted", Rules: []RuleSpec{cidrRule("1.1.1.1", "")}}, []string{"invalid port"}},
		{"range backwards", Spec{Mode: "restricted", Rules: []RuleSpec{cidrRule("1.1.1.1", "90-80")}}, []string{"ends before it starts"}},
		{"range open", Spec{Mode: "restricted", Rules: []RuleSpec{cidrRule("1.1.1.1", "80-")}}, []string{"invalid port"}},
		{"range three", Spec{Mode: "restricted", Rules: []RuleSpec{cidrRule("1.1.1.1", "1-2-3")}}, []string{"invalid port"}},
		{"too many ports", Spec{Mode: "restricted", Rules: []RuleSpec{cidrRule("1.1.1.1", manyPorts...)}}, []string{"33 port entries, more than 32"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := ParseDefault("network", c.spec)
			if err == nil {
				t.Fatalf("accepted: %+v", p)
			}
			if errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
				t.Errorf("code %s, want invalid_argument: %v", errdefs.CodeOf(err), err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("message %q lacks %q", err, w)
				}
			}
		})
	}
}

// TestParseLimits: the limits are configurable, and exactly the limit is
// accepted.
func TestParseLimits(t *testing.T) {
	l := Limits{MaxRules: 2, MaxPorts: 1}
	two := Spec{Mode: "restricted", Rules: []RuleSpec{cidrRule("1.1.1.1", "80"), cidrRule("1.1.1.2")}}
	if _, err := l.Parse("network", two); err != nil {
		t.Fatalf("at the limits: %v", err)
	}
	three := two
	three.Rules = append(three.Rules, cidrRule("1.1.1.3"))
	if _, err := l.Parse("network", three); err == nil || !strings.Contains(err.Error(), "3 rules, more than 2") {
		t.Errorf("3 rules: %v", err)
	}
	if _, err := l.Parse("network", Spec{Mode: "restricted", Rules: []RuleSpec{cidrRule("1.1.1.1", "80", "81")}}); err == nil || !strings.Contains(err.Error(), "2 port entries, more than 1") {
		t.Errorf("2 ports: %v", err)
	}
}

// TestParseAccepts: good policies and their normal form.
func TestParseAccepts(t *testing.T) {
	cases := []struct {
		name string
		spec Spec
		want string // the rules, rendered
	}{
		{"empty is deny_all", Spec{}, "deny_all"},
		{"open no rules", Spec{Mode: "open"}, "open"},
		{"restricted no rules", Spec{Mode: "restricted"}, "restricted"},
		{"host bits masked", Spec{Mode: "restricted", Rules: []RuleSpec{cidrRule("10.1.2.3/8")}}, "restricted 10.0.0.0/8"},
		{"bare v4 address", Spec{Mode: "restricted", Rules: []RuleSpec{cidrRule("203.0.113.7")}}, "restricted 203.0.113.7/32"},
		{"v6 canonical", Spec{Mode: "restricted", Rules: []RuleSpec{cidrRule("2001:DB8:0:0::1/32")}}, "restricted 2001:db8::/32"},
		{"bare v6", Spec{Mode: "restricted", Rules: []RuleSpec{cidrRule("2001:db8::1")}}, "restricted 2001:db8::1/128"},
		{"zero prefix", Spec{Mode: "open", Rules: []RuleSpec{cidrRule("0.0.0.0/0")}}, "open 0.0.0.0/0"},
		{"domain lower, no dot", Spec{Mode: "restricted", Rules: []RuleSpec{{Domain: "API.Example.COM."}}}, "restricted api.example.com"},
		{"wildcard", Spec{Mode: "restricted", Rules: []RuleSpec{{Domain: "*.Example.com"}}}, "restricted *.example.com"},
		{"underscore, digits, punycode", Spec{Mode: "restricted", Rules: []RuleSpec{{Domain: "_x.1a.xn--bcher-kva.de"}}}, "restricted _x.1a.xn--bcher-kva.de"},
		{"max name", Spec{Mode: "restricted", Rules: []RuleSpec{{Domain: strings.Repeat(strings.Repeat("a", 62)+".", 4) + "a"}}}, "restricted " + strings.Repeat(strings.Repeat("a", 62)+".", 4) + "a"},
		{"ports merged and sorted", Spec{Mode: "restricted", Rules: []RuleSpec{cidrRule("1.1.1.1", "443", "80-90", "85-100", "101", "8080")}}, "restricted 1.1.1.1/32 ports 80-101,443,8080"},
		{"full range stays explicit", Spec{Mode: "restricted", Rules: []RuleSpec{cidrRule("1.1.1.1", "1-100", "101-65535")}}, "restricted 1.1.1.1/32 ports 1-65535"},
		{"duplicates merged", Spec{Mode: "restricted", Rules: []RuleSpec{cidrRule("1.1.1.1", "80"), cidrRule("1.1.1.1/32", "80")}}, "restricted 1.1.1.1/32 ports 80"},
		{"same target ports united", Spec{Mode: "restricted", Rules: []RuleSpec{cidrRule("1.1.1.1", "80"), cidrRule("1.1.1.1", "443")}}, "restricted 1.1.1.1/32 ports 80,443"},
		{"all ports wins", Spec{Mode: "restricted", Rules: []RuleSpec{cidrRule("1.1.1.1", "80"), cidrRule("1.1.1.1")}}, "restricted 1.1.1.1/32"},
		{"tcp+udp fold to both", Spec{Mode: "restricted", Rules: []RuleSpec{
			{CIDR: "1.1.1.1", Protocol: "udp", Ports: []string{"53"}}, {CIDR: "1.1.1.1", Protocol: "tcp", Ports: []string{"53"}}}}, "restricted 1.1.1.1/32 ports 53"},
		{"both splits when ports differ", Spec{Mode: "restricted", Rules: []RuleSpec{
			{CIDR: "1.1.1.1", Ports: []string{"53"}}, {CIDR: "1.1.1.1", Protocol: "tcp", Ports: []string{"443"}}}}, "restricted 1.1.1.1/32 tcp ports 53,443; 1.1.1.1/32 udp ports 53"},
		{"sorted: v4, v6, domains", Spec{Mode: "restricted", Rules: []RuleSpec{
			{Domain: "b.example.com"}, cidrRule("2001:db8::/32"), {Domain: "a.example.com"}, cidrRule("10.0.0.0/8"), cidrRule("9.0.0.0/8"), cidrRule("10.0.0.0/16")}},
			"restricted 9.0.0.0/8; 10.0.0.0/8; 10.0.0.0/16; 2001:db8::/32; a.example.com; b.example.com"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := ParseDefault("network", c.spec)
			if err != nil {
				t.Fatal(err)
			}
			if got := render(p); got != c.want {
				t.Errorf("got  %q\nwant %q", got, c.want)
			}
		})
	}
}

func render(p Policy) string {
	var rs []string
	for _, r := range p.Rules {
		rs = append(rs, r.String())
	}
	if len(rs) == 0 {
		return string(p.Mode)
	}
	return string(p.Mode) + " " + strings.Join(rs, "; ")
}

// TestParseEqual: policies written differently but allowing the same
// rules are Equal; different ones are not.
func TestParseEqual(t *testing.T) {
	a := Spec{Mode: "restricted", Rules: []RuleSpec{
		{Domain: "Example.com."}, {CIDR: "10.0.0.1/8", Ports: []string{"443", "80"}}, {CIDR: "2001:db8::/48", Protocol: "udp"},
		{CIDR: "2001:db8::/48", Protocol: "tcp"},
	}}
	b := Spec{Mode: "restricted", Rules: []RuleSpec{
		{CIDR: "2001:db8:0::/48"}, {CIDR: "10.0.0.0/8", Ports: []string{"80"}}, {Domain: "example.com"},
		{CIDR: "10.0.0.0/8", Ports: []string{"443"}}, {Domain: "example.com"},
	}}
	pa, err := ParseDefault("network", a)
	if err != nil {
		t.Fatal(err)
	}
	pb, err := ParseDefault("network", b)
	if err != nil {
		t.Fatal(err)
	}
	if !pa.Equal(pb) {
		t.Errorf("not equal:\n%s\n%s", render(pa), render(pb))
	}
	b.Rules[1].Ports = []string{"81"}
	pc, _ := ParseDefault("network", b)
	if pa.Equal(pc) {
		t.Errorf("equal though ports differ: %s", render(pc))
	}
	if (Policy{Mode: ModeOpen}).Equal(Policy{Mode: ModeRestricted}) {
		t.Error("modes differ but Equal")
	}
}

// TestParseIdempotent: normalising a normal form changes nothing, for
// generated policies (a cheap fuzz over the shapes Parse merges).
func TestParseIdempotent(t *testing.T) {
	targets := []string{"10.0.0.0/8", "10.1.0.0/16", "2001:db8::/32", "1.2.3.4", "a.example.com", "*.example.com"}
	protos := []string{"", "tcp", "udp"}
	portSets := [][]string{nil, {"80"}, {"443", "80-81"}, {"1-65535"}}
	seed := uint32(1)
	next := func(n int) int { seed = seed*1664525 + 1013904223; return int(seed>>8) % n }
	for i := 0; i < 500; i++ {
		var spec Spec
		spec.Mode = "restricted"
		for j := next(8); j > 0; j-- {
			tg := targets[next(len(targets))]
			rs := RuleSpec{Protocol: protos[next(3)], Ports: portSets[next(len(portSets))]}
			if strings.ContainsAny(tg, "/") || tg[0] >= '0' && tg[0] <= '9' {
				rs.CIDR = tg
			} else {
				rs.Domain = tg
			}
			spec.Rules = append(spec.Rules, rs)
		}
		p, err := ParseDefault("network", spec)
		if err != nil {
			t.Fatalf("%+v: %v", spec, err)
		}
		again, err := ParseDefault("network", toSpec(p))
		if err != nil {
			t.Fatalf("reparse %s: %v", render(p), err)
		}
		if !again.Equal(p) {
			t.Fatalf("not idempotent:\n%s\n%s", render(p), render(again))
		}
		// Reversing the rules gives the same policy.
		rev := Spec{Mode: spec.Mode}
		for j := len(spec.Rules) - 1; j >= 0; j-- {
			rev.Rules = append(rev.Rules, spec.Rules[j])
		}
		if pr, _ := ParseDefault("network", rev); !pr.Equal(p) {
			t.Fatalf("order matters:\n%s\n%s", render(p), render(pr))
		}
	}
}

// toSpec writes a policy back as a caller would.
func toSpec(p Policy) Spec {
	s := Spec{Mode: string(p.Mode)}
	for _, r := range p.Rules {
		rs := RuleSpec{Domain: r.Domain, Protocol: string(r.Protocol)}
		if !r.IsDomain() {
			rs.CIDR = r.CIDR.String()
		}
		for _, pr := range r.Ports {
			rs.Ports = append(rs.Ports, pr.String())
		}
		s.Rules = append(s.Rules, rs)
	}
	return s
}

func TestParseCIDRForms(t *testing.T) {
	for in, want := range map[string]string{
		"192.0.2.1":      "192.0.2.1/32",
		"192.0.2.255/24": "192.0.2.0/24",
		"::/0":           "::/0",
		"::1":            "::1/128",
		"fd00:ec2::254":  "fd00:ec2::254/128",
	} {
		got, err := ParseCIDR(in)
		if err != nil || got != netip.MustParsePrefix(want) {
			t.Errorf("ParseCIDR(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
}
