package netpolicy

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/errdefs"
)

// FuzzParseRule: whatever a caller sends, Parse answers a policy or an
// invalid_argument (never panics, never another code), and what it
// accepts is in normal form: parsing it again gives the same policy, and
// Resolve keeps its sets disjoint. The seeds run with every `go test`;
// `go test -fuzz FuzzParseRule ./internal/netpolicy` explores further.
func FuzzParseRule(f *testing.F) {
	for _, s := range [][5]string{
		{"restricted", "10.0.0.0/8", "", "tcp", "443"},
		{"restricted", "", "*.example.com", "", "80-90"},
		{"open", "::/0", "", "udp", "53"},
		{"restricted", "1.2.3.4", "", "", ""},
		{"restricted", "10.0.0.300/8", "", "", ""},
		{"restricted", "", "a..b", "", ""},
		{"restricted", "", "*.*.x.y", "", ""},
		{"restricted", "::ffff:1.2.3.4", "", "", ""},
		{"deny_all", "", "", "", ""},
		{"restricted", "fe80::1%eth0", "", "", "65536"},
		{"restricted", "", strings.Repeat("a.", 127) + "a", "", "1-65535"},
	} {
		f.Add(s[0], s[1], s[2], s[3], s[4])
	}
	facts := Facts{Pool: Pool{V4: netip.MustParsePrefix("10.200.0.0/16"), V6: netip.MustParsePrefix("fd00:c71d::/64")}}
	facts.Block, _ = facts.Pool.Block(1)
	f.Fuzz(func(t *testing.T, mode, cidr, domain, proto, ports string) {
		spec := Spec{Mode: mode}
		if cidr != "" || domain != "" || proto != "" || ports != "" {
			rs := RuleSpec{CIDR: cidr, Domain: domain, Protocol: proto}
			if ports != "" {
				rs.Ports = strings.Split(ports, ",")
			}
			spec.Rules = []RuleSpec{rs, rs} // a duplicate is merged
		}
		p, err := ParseDefault("network", spec)
		if err != nil {
			if errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
				t.Fatalf("%+v: code %s: %v", spec, errdefs.CodeOf(err), err)
			}
			return
		}
		if len(p.Rules) > 1 {
			t.Fatalf("a duplicated rule gave %d rules: %s", len(p.Rules), render(p))
		}
		again, err := ParseDefault("network", toSpec(p))
		if err != nil || !again.Equal(p) {
			t.Fatalf("normal form %s does not parse to itself: %s, %v", render(p), render(again), err)
		}
		e := Resolve(p, facts)
		checkDisjoint(t, e.Allow4)
		checkDisjoint(t, e.Allow6)
	})
}
