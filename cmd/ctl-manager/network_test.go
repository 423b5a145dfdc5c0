package main

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/api"
)

func TestParseAllow(t *testing.T) {
	for _, c := range []struct {
		in   string
		want api.NetworkRule
		bad  string
	}{
		{in: "203.0.113.0/24", want: api.NetworkRule{CIDR: "203.0.113.0/24"}},
		{in: "203.0.113.7", want: api.NetworkRule{CIDR: "203.0.113.7"}},
		{in: "203.0.113.0/24:443", want: api.NetworkRule{CIDR: "203.0.113.0/24", Ports: []string{"443"}}},
		{in: "203.0.113.0/24:443,8000-8100/tcp", want: api.NetworkRule{CIDR: "203.0.113.0/24", Protocol: "tcp", Ports: []string{"443", "8000-8100"}}},
		{in: "1.1.1.1/udp", want: api.NetworkRule{CIDR: "1.1.1.1", Protocol: "udp"}},
		{in: "2001:db8::/32", want: api.NetworkRule{CIDR: "2001:db8::/32"}},
		{in: "2001:db8::/32/tcp", want: api.NetworkRule{CIDR: "2001:db8::/32", Protocol: "tcp"}},
		{in: "[2001:db8::/32]:443/udp", want: api.NetworkRule{CIDR: "2001:db8::/32", Protocol: "udp", Ports: []string{"443"}}},
		{in: "[2001:db8::1]", want: api.NetworkRule{CIDR: "2001:db8::1"}},
		// Values are the node's to judge: passed on as written.
		{in: "10.0.0.0/33:99999", want: api.NetworkRule{CIDR: "10.0.0.0/33", Ports: []string{"99999"}}},
		{in: "10.0.0.0/8:", bad: "empty port list"},
		{in: ":443", bad: "empty CIDR"},
		{in: "[2001:db8::1", bad: "missing ']'"},
		{in: "[2001:db8::1]443", bad: "want ':PORTS' after ']'"},
	} {
		got, err := parseAllow(c.in)
		if c.bad != "" {
			if err == nil || !strings.Contains(err.Error(), c.bad) {
				t.Errorf("parseAllow(%q) = %+v, %v; want an error containing %q", c.in, got, err, c.bad)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("parseAllow(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
}

func TestParseAllowDomain(t *testing.T) {
	for _, c := range []struct {
		in   string
		want api.NetworkRule
		bad  bool
	}{
		{in: "example.com", want: api.NetworkRule{Domain: "example.com"}},
		{in: "*.example.com:443", want: api.NetworkRule{Domain: "*.example.com", Ports: []string{"443"}}},
		{in: "api.example.com:443,8443/tcp", want: api.NetworkRule{Domain: "api.example.com", Protocol: "tcp", Ports: []string{"443", "8443"}}},
		{in: ":443", bad: true},
		{in: "example.com:", bad: true},
	} {
		got, err := parseAllowDomain(c.in)
		if (err != nil) != c.bad || (!c.bad && !reflect.DeepEqual(got, c.want)) {
			t.Errorf("parseAllowDomain(%q) = %+v, %v; want %+v (error %v)", c.in, got, err, c.want, c.bad)
		}
	}
}

func TestCLISandboxNetwork(t *testing.T) {
	e := newEnv(t)
	e.ok("sandbox", "create", "sb1", "--", "sleep", "infinity")
	out := e.ok("sandbox", "network", "sb1", "--mode", "restricted",
		"--allow", "203.0.113.0/24:443/tcp", "--allow", "[2001:db8::/32]:443", "--allow-domain", "*.example.com:443/tcp")
	if out != "sandbox sb1 generation 1: network restricted, sent 0 bytes in 0 packets, dropped 0 packets\n" {
		t.Fatalf("network output %q", out)
	}
	want := api.NetworkPolicy{Mode: api.NetworkRestrict, Rules: []api.NetworkRule{
		{CIDR: "203.0.113.0/24", Protocol: "tcp", Ports: []string{"443"}},
		{CIDR: "2001:db8::/32", Ports: []string{"443"}},
		{Domain: "*.example.com", Protocol: "tcp", Ports: []string{"443"}},
	}}
	if got, _ := e.node.Policy("sb1"); !reflect.DeepEqual(got, want) {
		t.Fatalf("the node got %+v, want %+v", got, want)
	}
	if out := e.ok("sandbox", "get", "sb1"); !strings.Contains(out, "  network:    restricted, sent 0 bytes") {
		t.Errorf("get shows no network line:\n%s", out)
	}
	var sb api.Sandbox
	if err := json.Unmarshal([]byte(e.ok("--json", "sandbox", "network", "sb1", "--mode", "open")), &sb); err != nil || sb.Network == nil || sb.Network.Mode != api.NetworkOpen {
		t.Fatalf("--json network open: %+v %v", sb, err)
	}

	// Bad flags are usage errors (exit 2); bad values get the
	// invalid_argument a claim's network gets (api.NetworkPolicy.Validate).
	// Neither reaches the node.
	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"sandbox", "network", "sb1"}, 2, "needs --mode"},
		{[]string{"sandbox", "network", "sb1", "--mode", "restricted", "--allow", "10.0.0.0/8:"}, 2, `--allow "10.0.0.0/8:": empty port list`},
		{[]string{"sandbox", "network", "sb1", "sb2", "--mode", "open"}, 2, "ID"},
		{[]string{"sandbox", "network", "sb1", "--mode", "restricted", "--allow", "10.0.0.0/33"}, exitFailed, `invalid_argument: network.rules[0]: invalid cidr "10.0.0.0/33"`},
		{[]string{"sandbox", "network", "sb1", "--mode", "open", "--allow-domain", "example.com"}, exitFailed, `a domain rule needs mode "restricted"`},
		{[]string{"sandbox", "network", "sb1", "--mode", "everything"}, exitFailed, `unknown network.mode "everything"`},
		{[]string{"sandbox", "network", "nope", "--mode", "open"}, exitFailed, "not_found"},
	} {
		r := e.run("", c.args...)
		if r.code != c.code || !strings.Contains(r.stderr, c.msg) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d containing %q", c.args, r.code, r.stderr, c.code, c.msg)
		}
	}
	if got, _ := e.node.Policy("sb1"); got.Mode != api.NetworkOpen {
		t.Errorf("a refused update changed the node's policy: %+v", got)
	}

	// create writes its policy with the same flags (--network is the
	// mode: create's --mode is the RootFS's).
	r := e.run("", "sandbox", "create", "sb2", "--network", "restricted", "--allow", "203.0.113.0/24:443/tcp")
	want = api.NetworkPolicy{Mode: api.NetworkRestrict, Rules: []api.NetworkRule{{CIDR: "203.0.113.0/24", Protocol: "tcp", Ports: []string{"443"}}}}
	if got, _ := e.node.Policy("sb2"); r.code != 0 || !reflect.DeepEqual(got, want) {
		t.Errorf("create --network restricted: %+v; the node has %+v, want %+v", r, got, want)
	}
}
