package flows

import (
	"net/netip"
	"testing"

	"github.com/ctld/ctld/internal/netpolicy"
)

// facts: a node with a public uplink address, IPv6 on, holding slot 1
// (sandbox 10.200.0.3 / fd00:c71d::6, gateway 10.200.0.2 / fd00:c71d::5).
func facts(t *testing.T, v6 bool) netpolicy.Facts {
	t.Helper()
	pool := netpolicy.Pool{V4: netip.MustParsePrefix("10.200.0.0/16")}
	if v6 {
		pool.V6 = netip.MustParsePrefix("fd00:c71d::/64")
	}
	if err := pool.Check(); err != nil {
		t.Fatal(err)
	}
	b, err := pool.Block(1)
	if err != nil {
		t.Fatal(err)
	}
	return netpolicy.Facts{Pool: pool, Block: b, NodeAddrs: []netip.Addr{netip.MustParseAddr("198.51.100.10")}}
}

func effective(t *testing.T, v6 bool, s netpolicy.Spec) netpolicy.Effective {
	t.Helper()
	p, err := netpolicy.ParseDefault("network", s)
	if err != nil {
		t.Fatal(err)
	}
	return netpolicy.Resolve(p, facts(t, v6))
}

func flow(proto uint8, src, dst string, dport uint16) Tuple {
	return Tuple{Proto: proto, Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst), SrcPort: 40000, DstPort: dport}
}

const (
	sb4 = "10.200.0.3"
	sb6 = "fd00:c71d::6"
	gw4 = "10.200.0.2"
)

func TestKeep(t *testing.T) {
	restricted := netpolicy.Spec{Mode: "restricted", Rules: []netpolicy.RuleSpec{
		{CIDR: "93.184.216.0/24", Protocol: "tcp", Ports: []string{"443"}},
		{CIDR: "2001:db8:1::/48"},
		{CIDR: "10.1.0.0/16", Protocol: "udp", Ports: []string{"5000-5010"}},
		{Domain: "example.com", Protocol: "tcp", Ports: []string{"443"}},
	}}
	open := netpolicy.Spec{Mode: "open"}
	denyAll := netpolicy.Spec{Mode: "deny_all"}
	example := [][]netip.Addr{{netip.MustParseAddr("1.1.1.1"), netip.MustParseAddr("169.254.169.254")}}

	for _, c := range []struct {
		name     string
		spec     netpolicy.Spec
		v6       bool
		resolved [][]netip.Addr
		flow     Tuple
		keep     bool
	}{
		{"allowed cidr and port", restricted, true, nil, flow(protoTCP, sb4, "93.184.216.34", 443), true},
		{"allowed cidr, other port", restricted, true, nil, flow(protoTCP, sb4, "93.184.216.34", 80), false},
		{"allowed cidr, other protocol", restricted, true, nil, flow(protoUDP, sb4, "93.184.216.34", 443), false},
		{"address outside every rule", restricted, true, nil, flow(protoTCP, sb4, "93.184.217.1", 443), false},
		{"private range a rule names, port in range", restricted, true, nil, flow(protoUDP, sb4, "10.1.2.3", 5005), true},
		{"private range a rule names, port past range", restricted, true, nil, flow(protoUDP, sb4, "10.1.2.3", 5011), false},
		{"private range no rule names", restricted, true, nil, flow(protoUDP, sb4, "10.2.0.1", 5005), false},
		{"domain port, address unknown (nil resolved)", restricted, true, nil, flow(protoTCP, sb4, "1.1.1.1", 443), false},
		{"domain port, address live in the set", restricted, true, example, flow(protoTCP, sb4, "1.1.1.1", 443), true},
		{"domain set address, other port", restricted, true, example, flow(protoTCP, sb4, "1.1.1.1", 80), false},
		{"domain set address, other protocol", restricted, true, example, flow(protoUDP, sb4, "1.1.1.1", 443), false},
		{"metadata in a domain set stays closed", restricted, true, example, flow(protoTCP, sb4, "169.254.169.254", 443), false},
		{"dns proxy on the gateway", restricted, true, nil, flow(protoUDP, sb4, gw4, 53), true},
		{"dns proxy over tcp", restricted, true, nil, flow(protoTCP, sb4, gw4, 53), true},
		{"gateway, other port", restricted, true, nil, flow(protoTCP, sb4, gw4, 22), false},
		{"other resolver", restricted, true, nil, flow(protoUDP, sb4, "8.8.8.8", 53), false},
		{"icmp", restricted, true, nil, flow(1, sb4, "93.184.216.34", 0), false},
		{"spoofed source", restricted, true, nil, flow(protoTCP, "10.200.0.5", "93.184.216.34", 443), false},
		{"v6 cidr, any port", restricted, true, nil, flow(protoTCP, sb6, "2001:db8:1::1", 8080), true},
		{"v6 cidr, dns port closed in restricted", restricted, true, nil, flow(protoUDP, sb6, "2001:db8:1::1", 53), false},
		{"v6 outside", restricted, true, nil, flow(protoTCP, sb6, "2001:db8:2::1", 443), false},
		{"v6 on a node without v6", restricted, false, nil, flow(protoTCP, sb6, "2001:db8:1::1", 443), false},
		{"v4-mapped form of an allowed address", restricted, true, nil, flow(protoTCP, "::ffff:"+sb4, "::ffff:93.184.216.34", 443), true},

		{"open: public address", open, true, nil, flow(protoTCP, sb4, "1.1.1.1", 443), true},
		{"open: other resolver", open, true, nil, flow(protoUDP, sb4, "8.8.8.8", 53), true},
		{"open: private range", open, true, nil, flow(protoTCP, sb4, "10.0.0.7", 22), false},
		{"open: metadata", open, true, nil, flow(protoTCP, sb4, "169.254.169.254", 80), false},
		{"open: node address", open, true, nil, flow(protoTCP, sb4, "198.51.100.10", 22), false},
		{"open: another sandbox", open, true, nil, flow(protoTCP, sb4, "10.200.0.7", 80), false},
		{"open: v6 public", open, true, nil, flow(protoTCP, sb6, "2001:db8:2::1", 443), true},

		{"deny_all: public address", denyAll, true, nil, flow(protoTCP, sb4, "1.1.1.1", 443), false},
		{"deny_all: dns proxy", denyAll, true, nil, flow(protoUDP, sb4, gw4, 53), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			eff := effective(t, c.v6, c.spec)
			if got := Keep(c.flow, eff, c.resolved); got != c.keep {
				t.Errorf("Keep(%s) = %v, want %v; policy:\n%s", c.flow, got, c.keep, eff)
			}
		})
	}
}

func TestMark(t *testing.T) {
	for _, c := range []struct {
		mask uint32
		slot netpolicy.Slot
		want uint32
		ok   bool
	}{
		{DefaultMask, 1, 1, true},
		{DefaultMask, netpolicy.MaxSlots - 1, 0xfffff, true},
		{0xffffffff, 7, 7, true},
		{0xff, 0x1a, 0x1a, true},                    // a small pool's mask
		{DefaultMask, 0, 0, false},                  // slot 0 would select every unmarked flow
		{DefaultMask, netpolicy.MaxSlots, 0, false}, // beyond any pool
		{0xff, 0x100, 0, false},                     // outside the mask
		{0xfffff000, 1, 0, false},
		{0, 1, 0, false},
	} {
		got, err := Mark(c.mask, c.slot)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("Mark(%#x, %d) = %#x, %v; want %#x, ok %v", c.mask, c.slot, got, err, c.want, c.ok)
		}
	}
}
