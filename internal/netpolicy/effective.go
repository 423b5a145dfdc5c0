package netpolicy

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// What a policy means on one node, as plain data: Resolve turns a Policy
// and the node's address facts into the exact sets the firewall loads, so
// rendering them as nft objects is a translation with no decisions left.

// Tier says when a reserved range can be reached.
type Tier int

const (
	// TierNever: not reachable whatever the rules say (the host itself,
	// loopback, addresses that are not unicast beyond a link). Towards
	// the node a sandbox reaches only its DNS proxy, through the input
	// hook, never through a rule.
	TierNever Tier = iota
	// TierNamed: reachable only through a rule whose CIDR lies inside the
	// range (metadata, other sandboxes): "0.0.0.0/0" does not open it,
	// "169.254.169.254/32" does.
	TierNamed
	// TierPrivate: the private ranges (RFC 1918, CGNAT, ULA). Closed in
	// open and restricted unless a rule's CIDR lies inside the range.
	TierPrivate
)

func (t Tier) String() string {
	switch t {
	case TierNever:
		return "never"
	case TierNamed:
		return "named"
	case TierPrivate:
		return "private"
	}
	return fmt.Sprintf("tier(%d)", int(t))
}

// Reserved is a range the policy treats specially, and why.
type Reserved struct {
	Prefix netip.Prefix
	Tier   Tier
	Why    string
}

// Fixed reserved ranges. The node's own addresses and the sandbox pool are
// added from Facts.
var fixedReserved = []Reserved{
	{netip.MustParsePrefix("0.0.0.0/8"), TierNever, "this network"},
	{netip.MustParsePrefix("127.0.0.0/8"), TierNever, "host loopback"},
	{netip.MustParsePrefix("224.0.0.0/4"), TierNever, "multicast"},
	{netip.MustParsePrefix("240.0.0.0/4"), TierNever, "reserved and broadcast"},
	{netip.MustParsePrefix("::/128"), TierNever, "unspecified"},
	{netip.MustParsePrefix("::1/128"), TierNever, "host loopback"},
	{netip.MustParsePrefix("fe80::/10"), TierNever, "link-local"},
	{netip.MustParsePrefix("ff00::/8"), TierNever, "multicast"},
	{netip.MustParsePrefix("169.254.0.0/16"), TierNamed, "link-local and metadata"},
	{netip.MustParsePrefix("fd00:ec2::254/128"), TierNamed, "metadata"},
	// IPv4 inside IPv6: through a NAT64 gateway (DNS64 answers), a 6to4
	// relay or a stack that maps, these reach every IPv4 address, the
	// reserved ones included (64:ff9b::a9fe:a9fe is 169.254.169.254).
	// Closed as a whole: checking the embedded address against the IPv4
	// deny set would need a translator's view of the prefix (RFC 6052
	// allows other lengths and operator prefixes), and a guest that needs
	// one names it.
	{netip.MustParsePrefix("::ffff:0:0/96"), TierNamed, "IPv4-mapped"},
	{netip.MustParsePrefix("64:ff9b::/96"), TierNamed, "NAT64 well-known prefix"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), TierNamed, "NAT64 local-use prefix"},
	{netip.MustParsePrefix("2002::/16"), TierNamed, "6to4"},
	{netip.MustParsePrefix("10.0.0.0/8"), TierPrivate, "RFC 1918"},
	{netip.MustParsePrefix("172.16.0.0/12"), TierPrivate, "RFC 1918"},
	{netip.MustParsePrefix("192.168.0.0/16"), TierPrivate, "RFC 1918"},
	{netip.MustParsePrefix("100.64.0.0/10"), TierPrivate, "CGNAT"},
	{netip.MustParsePrefix("fc00::/7"), TierPrivate, "ULA"},
}

// Facts are what the node knows when it applies a policy.
type Facts struct {
	// Pool is the node's sandbox pool: every address in it is a sandbox
	// (or the node side of one), so it is reserved TierNamed.
	Pool Pool
	// Block is this generation's addresses: the only source it may send
	// from, and the gateway its DNS proxy listens on.
	Block Block
	// NodeAddrs are the addresses of the node's own interfaces.
	NodeAddrs []netip.Addr
}

// ReservedRanges lists every reserved range for f: the fixed ones, the
// node's addresses (TierNever) and the pool (TierNamed).
func ReservedRanges(f Facts) []Reserved {
	out := slices.Clone(fixedReserved)
	for _, a := range f.NodeAddrs {
		if !a.IsValid() {
			continue
		}
		a = a.Unmap().WithZone("")
		out = append(out, Reserved{netip.PrefixFrom(a, a.BitLen()), TierNever, "node address"})
	}
	if f.Pool.V4.IsValid() {
		out = append(out, Reserved{f.Pool.V4, TierNamed, "sandbox pool"})
	}
	if f.Pool.IPv6() {
		out = append(out, Reserved{f.Pool.V6, TierNamed, "sandbox pool"})
	}
	return out
}

// Element is one element of a sandbox's allow set: a destination range,
// a protocol (tcp or udp) and a port range, the key of an nft
// concatenated interval set (ip daddr . meta l4proto . th dport). The
// elements of one Effective never overlap, as the kernel requires.
type Element struct {
	Dst   AddrRange
	Proto Proto
	Ports PortRange
}

func (e Element) String() string { return fmt.Sprintf("%v %s %v", e.Dst, e.Proto, e.Ports) }

// DomainSet is the names whose DNS answers join one set: every domain
// rule with the same protocol and ports shares it, so an address answered
// for two names is one element with one timeout.
type DomainSet struct {
	Names []string // exact names and "*.suffix" patterns, sorted
	Proto Proto    // tcp or udp
	Ports []PortRange
}

// DomainSetSize is the most addresses one domain set holds: the nft set's
// size, and the default of the DNS proxy's cap on the distinct addresses
// it keeps for one generation. Names under an allowed wildcard are the
// guest's to invent, so without it each answer (up to 32 addresses, for
// up to an hour) would grow kernel memory without bound.
const DomainSetSize = 1024

// Effective is what the firewall enforces for one generation.
type Effective struct {
	Mode Mode
	// Source4 and Source6 are the only source addresses the sandbox may
	// send from (anti-spoofing); Source6 is zero when IPv6 is off, and
	// then all of its IPv6 is dropped.
	Source4, Source6 netip.Addr
	// DNS4 and DNS6 are the DNS proxy's addresses (the gateways), the
	// only thing on the node it reaches (udp and tcp 53). Zero in
	// deny_all.
	DNS4, DNS6 netip.Addr
	// Allow4 and Allow6 are the forward allow sets: disjoint, sorted.
	Allow4, Allow6 []Element
	// Deny4 and Deny6 are the reserved ranges that stay closed: the
	// proxy never adds an answer inside them (DNS rebinding to metadata
	// or the node), and the chain drops them before the domain sets.
	Deny4, Deny6 []AddrRange
	// Domains are the restricted mode's domain sets.
	Domains []DomainSet
	// OtherDNS: resolvers other than the proxy are reachable (open mode).
	// In restricted mode udp/tcp 53 and tcp 853 are closed except where
	// a rule lists the port explicitly.
	OtherDNS bool
	// Ignored are rules that do nothing on this node (IPv6 rules when the
	// node has no IPv6; rules inside the node's own or loopback ranges),
	// for the operator.
	Ignored []Rule
}

// dnsPorts are closed to everything but the proxy in restricted mode
// unless a rule lists them: DNS and DNS over TLS.
var dnsPorts = map[Proto][]uint16{ProtoTCP: {53, 853}, ProtoUDP: {53}}

// allPortsFor is what a rule without ports allows for proto.
func allPortsFor(proto Proto, mode Mode) []PortRange {
	if mode != ModeRestricted {
		return []PortRange{AllPorts}
	}
	var out []PortRange
	from := uint32(0)
	for _, p := range dnsPorts[proto] {
		if uint32(p) > from {
			out = append(out, PortRange{uint16(from), p - 1})
		}
		from = uint32(p) + 1
	}
	return append(out, PortRange{uint16(from), 65535})
}

func protosOf(p Proto) []Proto {
	if p == ProtoBoth {
		return []Proto{ProtoTCP, ProtoUDP}
	}
	return []Proto{p}
}

// Resolve computes what p means on the node f describes. p must be a
// parsed Policy.
func Resolve(p Policy, f Facts) Effective {
	v6 := f.Pool.IPv6() && f.Block.Addr6.IsValid()
	e := Effective{Mode: p.Mode, Source4: f.Block.Addr4}
	if v6 {
		e.Source6 = f.Block.Addr6
	}
	if p.Mode == ModeDenyAll || p.Mode == "" {
		e.Mode = ModeDenyAll
		return e
	}
	e.DNS4 = f.Block.Gateway4
	if v6 {
		e.DNS6 = f.Block.Gateway6
	}
	e.OtherDNS = p.Mode == ModeOpen
	rules := p.Rules
	if p.Mode == ModeOpen {
		rules = append([]Rule{{CIDR: netip.MustParsePrefix("0.0.0.0/0")}, {CIDR: netip.MustParsePrefix("::/0")}}, rules...)
	}
	reserved := ReservedRanges(f)
	var pieces4, pieces6 []piece
	domains := map[string]*DomainSet{}
	for _, r := range rules {
		if r.IsDomain() {
			for _, proto := range protosOf(r.Protocol) {
				ports := r.Ports
				if len(ports) == 0 {
					ports = allPortsFor(proto, p.Mode)
				}
				k := fmt.Sprint(proto, ports)
				ds := domains[k]
				if ds == nil {
					ds = &DomainSet{Proto: proto, Ports: ports}
					domains[k] = ds
				}
				ds.Names = append(ds.Names, r.Domain)
			}
			continue
		}
		is6 := r.CIDR.Addr().Is6()
		if is6 && !v6 {
			e.Ignored = append(e.Ignored, r)
			continue
		}
		dst := rangeOf(r.CIDR)
		allowed := []AddrRange{dst}
		for _, res := range reserved {
			rr := rangeOf(res.Prefix)
			if res.Tier == TierNever || !within(dst, rr) {
				allowed = subtract(allowed, rr)
			}
		}
		if len(allowed) == 0 {
			e.Ignored = append(e.Ignored, r) // inside the node's own ranges
			continue
		}
		for _, proto := range protosOf(r.Protocol) {
			ports := r.Ports
			if len(ports) == 0 {
				ports = allPortsFor(proto, p.Mode)
			}
			for _, a := range allowed {
				pc := piece{a, proto, ports}
				if is6 {
					pieces6 = append(pieces6, pc)
				} else {
					pieces4 = append(pieces4, pc)
				}
			}
		}
	}
	e.Allow4, e.Allow6 = disjoint(pieces4), disjoint(pieces6)
	e.Deny4 = closed(reserved, pieces4, false)
	if v6 {
		e.Deny6 = closed(reserved, pieces6, true)
	}
	for _, ds := range domains {
		slices.Sort(ds.Names)
		ds.Names = slices.Compact(ds.Names)
		e.Domains = append(e.Domains, *ds)
	}
	slices.SortFunc(e.Domains, func(a, b DomainSet) int {
		return cmp.Or(strings.Compare(string(a.Proto), string(b.Proto)), strings.Compare(fmt.Sprint(a.Ports), fmt.Sprint(b.Ports)))
	})
	return e
}

// closed is the reserved ranges of one family less what the rules opened.
func closed(reserved []Reserved, opened []piece, is6 bool) []AddrRange {
	var rs []AddrRange
	for _, res := range reserved {
		if res.Prefix.Addr().Is6() == is6 {
			rs = append(rs, rangeOf(res.Prefix))
		}
	}
	rs = union(rs)
	for _, p := range opened {
		rs = subtract(rs, p.r)
	}
	return union(rs)
}

// piece is a destination range one rule allows for one protocol.
type piece struct {
	r     AddrRange
	proto Proto
	ports []PortRange
}

// disjoint turns overlapping pieces (one family) into non-overlapping set
// elements: it cuts the address space at every piece's ends, unites the
// ports of the pieces over each cut, and merges neighbouring cuts that
// allow the same ports.
func disjoint(pieces []piece) []Element {
	if len(pieces) == 0 {
		return nil
	}
	var cuts []netip.Addr
	for _, p := range pieces {
		cuts = append(cuts, p.r.From)
		if n := p.r.To.Next(); n.IsValid() {
			cuts = append(cuts, n)
		}
	}
	slices.SortFunc(cuts, netip.Addr.Compare)
	cuts = slices.Compact(cuts)
	pieces = slices.Clone(pieces)
	slices.SortFunc(pieces, func(a, b piece) int { return a.r.From.Compare(b.r.From) })

	type seg struct {
		r        AddrRange
		tcp, udp []PortRange
	}
	var segs []seg
	var active []piece
	next := 0
	for i, c := range cuts {
		for next < len(pieces) && pieces[next].r.From.Compare(c) <= 0 {
			active = append(active, pieces[next])
			next++
		}
		active = slices.DeleteFunc(active, func(p piece) bool { return p.r.To.Less(c) })
		if len(active) == 0 {
			continue
		}
		var end netip.Addr
		if i+1 < len(cuts) {
			end = cuts[i+1].Prev()
		} else {
			end = lastAddr(netip.PrefixFrom(c, 0))
		}
		var tcp, udp []PortRange
		for _, p := range active {
			if p.proto == ProtoTCP {
				tcp = append(tcp, p.ports...)
			} else {
				udp = append(udp, p.ports...)
			}
		}
		s := seg{AddrRange{c, end}, mergePorts(tcp), mergePorts(udp)}
		if n := len(segs); n > 0 && segs[n-1].r.To.Next() == c &&
			slices.Equal(segs[n-1].tcp, s.tcp) && slices.Equal(segs[n-1].udp, s.udp) {
			segs[n-1].r.To = end
			continue
		}
		segs = append(segs, s)
	}
	var out []Element
	for _, s := range segs {
		for _, pr := range s.tcp {
			out = append(out, Element{s.r, ProtoTCP, pr})
		}
		for _, pr := range s.udp {
			out = append(out, Element{s.r, ProtoUDP, pr})
		}
	}
	return out
}

// String renders the effective policy as text, one line a fact, for tests
// and for an operator comparing it with `nft list ruleset`.
func (e Effective) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "mode %s\n", e.Mode)
	fmt.Fprintf(&b, "source %v %v\n", e.Source4, e.Source6)
	if e.DNS4.IsValid() || e.DNS6.IsValid() {
		fmt.Fprintf(&b, "dns proxy %v %v\n", e.DNS4, e.DNS6)
	}
	if e.OtherDNS {
		b.WriteString("other resolvers open\n")
	}
	for _, el := range e.Allow4 {
		fmt.Fprintf(&b, "allow %v\n", el)
	}
	for _, el := range e.Allow6 {
		fmt.Fprintf(&b, "allow %v\n", el)
	}
	for _, r := range e.Deny4 {
		fmt.Fprintf(&b, "deny %v\n", r)
	}
	for _, r := range e.Deny6 {
		fmt.Fprintf(&b, "deny %v\n", r)
	}
	for _, d := range e.Domains {
		fmt.Fprintf(&b, "domains %s %v %s\n", d.Proto, d.Ports, strings.Join(d.Names, ","))
	}
	for _, r := range e.Ignored {
		fmt.Fprintf(&b, "ignored %v\n", r)
	}
	return b.String()
}
