package nft

import (
	"bytes"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/netpolicy"
)

var unitPool = netpolicy.Pool{V4: netip.MustParsePrefix("10.200.0.0/16"), V6: netip.MustParsePrefix("fd00:c71d::/64")}

func unitOwner(t *testing.T, slot netpolicy.Slot) netpolicy.Owner {
	t.Helper()
	b, err := unitPool.Block(slot)
	if err != nil {
		t.Fatal(err)
	}
	return netpolicy.Owner{ID: "web-1", Generation: 3, Block: b}
}

func unitEffective(t *testing.T, o netpolicy.Owner, mode netpolicy.Mode, rules ...netpolicy.RuleSpec) netpolicy.Effective {
	t.Helper()
	p, err := netpolicy.ParseDefault("network", netpolicy.Spec{Mode: string(mode), Rules: rules})
	if err != nil {
		t.Fatal(err)
	}
	return netpolicy.Resolve(p, netpolicy.Facts{Pool: unitPool, Block: o.Block, NodeAddrs: []netip.Addr{netip.MustParseAddr("192.168.1.10")}})
}

func setByName(g Generation, name string) (Set, bool) {
	i := slices.IndexFunc(g.Sets, func(s Set) bool { return s.Spec.Name == name })
	if i < 0 {
		return Set{}, false
	}
	return g.Sets[i], true
}

func TestRenderRestricted(t *testing.T) {
	o := unitOwner(t, 26)
	eff := unitEffective(t, o, netpolicy.ModeRestricted,
		netpolicy.RuleSpec{CIDR: "203.0.113.0/24", Protocol: "tcp", Ports: []string{"443", "8000-8100"}},
		netpolicy.RuleSpec{CIDR: "2001:db8::/32", Protocol: "udp", Ports: []string{"5000"}},
		netpolicy.RuleSpec{Domain: "*.example.com", Protocol: "tcp", Ports: []string{"443"}})
	g, err := RenderGeneration(Config{DNSPort: 5353, Pool: unitPool}, o, eff)
	if err != nil {
		t.Fatal(err)
	}
	if g.Chain.Spec.Name != "sb-web-1-g3" || g.Link != "ctl-0001a" || g.Mark != 26 {
		t.Errorf("chain %q link %q mark %d", g.Chain.Spec.Name, g.Link, g.Mark)
	}
	if !slices.Equal(g.Counters, []string{"sb-web-1-g3.tx", "sb-web-1-g3.drop"}) {
		t.Errorf("counters %v", g.Counters)
	}
	var names []string
	for _, s := range g.Sets {
		names = append(names, s.Spec.Name)
	}
	want := []string{"sb-web-1-g3.x4", "sb-web-1-g3.x6", "sb-web-1-g3.a4", "sb-web-1-g3.a6", "sb-web-1-g3.d0-4", "sb-web-1-g3.d0-6"}
	if !slices.Equal(names, want) {
		t.Errorf("sets %v, want %v", names, want)
	}

	// Allow sets: concatenated intervals whose element bytes are the
	// policy's elements, read back the way the kernel lists them.
	a4, _ := setByName(g, "sb-web-1-g3.a4")
	if !a4.Spec.Interval || !a4.Spec.Concatenation || a4.Spec.KeyType.Bytes != 12 || a4.Spec.KeyType.Name != "ipv4_addr . inet_proto . inet_service" {
		t.Errorf("a4 spec %+v", a4.Spec)
	}
	if len(a4.Elements) != len(eff.Allow4) {
		t.Fatalf("a4 has %d elements, want %d", len(a4.Elements), len(eff.Allow4))
	}
	for i, e := range a4.Elements {
		back, err := netpolicy.ParseElement(e.Key, e.KeyEnd)
		if err != nil || back != eff.Allow4[i] {
			t.Errorf("a4[%d] reads back as %v, %v; want %v", i, back, err, eff.Allow4[i])
		}
	}
	a6, _ := setByName(g, "sb-web-1-g3.a6")
	if a6.Spec.KeyType.Bytes != 24 || len(a6.Elements) != 1 {
		t.Errorf("a6 %+v", a6)
	}
	// 203.0.113.0/24 tcp 443 as the kernel's key bytes.
	if k := a4.Elements[0].Key; !bytes.Equal(k, []byte{203, 0, 113, 0, 6, 0, 0, 0, 1, 187, 0, 0}) {
		t.Errorf("a4[0] key %v", k)
	}

	// Reserved ranges: a single-field interval set (rbtree): start, and
	// an end element one past the range.
	x4, _ := setByName(g, "sb-web-1-g3.x4")
	if !x4.Spec.Interval || x4.Spec.Concatenation || x4.Spec.KeyType.Name != "ipv4_addr" {
		t.Errorf("x4 spec %+v", x4.Spec)
	}
	if n := len(x4.Elements); n == 0 || x4.Elements[0].IntervalEnd || !x4.Elements[1].IntervalEnd {
		t.Errorf("x4 elements %+v", x4.Elements)
	}
	first := eff.Deny4[0]
	if !bytes.Equal(x4.Elements[0].Key, first.From.AsSlice()) || !bytes.Equal(x4.Elements[1].Key, first.To.Next().AsSlice()) {
		t.Errorf("x4 first range %v rendered as %v..%v", first, x4.Elements[0].Key, x4.Elements[1].Key)
	}

	// IPv4 inside IPv6 (NAT64, 6to4, mapped) is in x6: a guest cannot
	// reach metadata or RFC 1918 as 64:ff9b::a9fe:a9fe.
	x6, _ := setByName(g, "sb-web-1-g3.x6")
	for _, a := range []string{"64:ff9b::a9fe:a9fe", "64:ff9b::a00:1", "64:ff9b:1::a9fe:a9fe", "2002:a9fe:a9fe::1", "::ffff:169.254.169.254", "fd00:ec2::254"} {
		if !inIntervals(x6.Elements, netip.MustParseAddr(a)) {
			t.Errorf("x6 does not hold %s", a)
		}
	}
	for _, a := range []string{"2001:db8::1", "64:ff9b::1:0:0", "2003::1"} {
		if inIntervals(x6.Elements, netip.MustParseAddr(a)) {
			t.Errorf("x6 holds %s", a)
		}
	}

	d0, _ := setByName(g, "sb-web-1-g3.d0-4")
	if !d0.Spec.HasTimeout || d0.Spec.Interval || len(d0.Elements) != 0 || d0.Spec.Size != netpolicy.DomainSetSize {
		t.Errorf("d0-4 %+v", d0)
	}

	// The DNS proxy's elements: link . gateway (redirect), link . source
	// → the slot (input, marked), in each family.
	link := ifname("ctl-0001a")
	wantEls := []Element{
		{Set: SetDNS4, Key: append(slices.Clone(link), o.Block.Gateway4.AsSlice()...)},
		{Set: MapSrc4, Key: append(slices.Clone(link), o.Block.Addr4.AsSlice()...), Val: []byte{26, 0, 0, 0}},
		{Set: SetDNS6, Key: append(slices.Clone(link), o.Block.Gateway6.AsSlice()...)},
		{Set: MapSrc6, Key: append(slices.Clone(link), o.Block.Addr6.AsSlice()...), Val: []byte{26, 0, 0, 0}},
	}
	if !slices.EqualFunc(g.Elements, wantEls, func(a, b Element) bool {
		return a.Set == b.Set && bytes.Equal(a.Key, b.Key) && bytes.Equal(a.Val, b.Val)
	}) {
		t.Errorf("elements %v, want %v", g.Elements, wantEls)
	}
	for i, k := range linkKeys(o.Block) {
		if e := g.Elements[i]; e.Set != k.Set || !bytes.Equal(k.key(g.Link), e.Key) {
			t.Errorf("linkKeys[%d] = %v does not find element %v", i, k, e)
		}
	}

	// Rule order: anti-spoofing v4 and v6, established, mark, x4, x6,
	// a4, a6, the domain rules, the final drop. The DNS proxy's flows
	// never come here (input accepts them by the src maps).
	rules := g.Chain.Rules
	if n := len(rules); n != 11 {
		t.Fatalf("%d rules, want 11", n)
	}
	for i, r := range rules {
		for _, e := range r.Exprs {
			if _, ok := e.(*expr.Fib); ok {
				t.Errorf("rule %d matches a local destination: %v", i, r.Exprs)
			}
		}
	}
	if c := cmpData(rules[0].Exprs, expr.CmpOpNeq); !bytes.Equal(c, o.Block.Addr4.AsSlice()) {
		t.Errorf("rule 0 is not v4 anti-spoofing: %v", c)
	}
	if c := cmpData(rules[1].Exprs, expr.CmpOpNeq); !bytes.Equal(c, o.Block.Addr6.AsSlice()) {
		t.Errorf("rule 1 is not v6 anti-spoofing: %v", c)
	}
	for i, wantSet := range map[int]string{4: "sb-web-1-g3.x4", 5: "sb-web-1-g3.x6", 6: "sb-web-1-g3.a4", 7: "sb-web-1-g3.a6", 8: "sb-web-1-g3.d0-4", 9: "sb-web-1-g3.d0-6"} {
		if got := lookups(rules[i].Exprs); !slices.Equal(got, []string{wantSet}) {
			t.Errorf("rule %d looks up %v, want %s", i, got, wantSet)
		}
	}
	for i, r := range rules {
		v := last(r.Exprs)
		switch {
		case i == 3: // the mark rule has no verdict
			if v != nil {
				t.Errorf("mark rule has verdict %v", v)
			}
		case i == 0 || i == 1 || i == 4 || i == 5 || i == 10:
			if v == nil || v.Kind != expr.VerdictDrop || !slices.Contains(objrefs(r.Exprs), "sb-web-1-g3.drop") {
				t.Errorf("rule %d: want counted drop, got %v %v", i, v, objrefs(r.Exprs))
			}
		default:
			if v == nil || v.Kind != expr.VerdictAccept || !slices.Contains(objrefs(r.Exprs), "sb-web-1-g3.tx") {
				t.Errorf("rule %d: want counted accept, got %v %v", i, v, objrefs(r.Exprs))
			}
		}
	}
	if len(rules[10].Exprs) != 2 {
		t.Errorf("the final rule is not an unconditional drop: %v", rules[10].Exprs)
	}
	if !strings.HasPrefix(rules[8].Comment, "ctld domains sb-web-1-g3.d0-4 tcp") {
		t.Errorf("domain rule comment %q", rules[8].Comment)
	}
	// The mark keeps the bits outside the mask and sets the slot.
	bw := findBitwise(rules[3].Exprs)
	if bw == nil || !bytes.Equal(bw.Mask, []byte{0, 0, 0xf0, 0xff}) || !bytes.Equal(bw.Xor, []byte{26, 0, 0, 0}) {
		t.Errorf("mark bitwise %+v", bw)
	}
}

func TestRenderNoIPv6DropsIt(t *testing.T) {
	pool := netpolicy.Pool{V4: netip.MustParsePrefix("10.200.0.0/16")}
	b, err := pool.Block(2)
	if err != nil {
		t.Fatal(err)
	}
	o := netpolicy.Owner{ID: "a", Generation: 1, Block: b}
	p, err := netpolicy.ParseDefault("network", netpolicy.Spec{Mode: "open"})
	if err != nil {
		t.Fatal(err)
	}
	eff := netpolicy.Resolve(p, netpolicy.Facts{Pool: pool, Block: b})
	g, err := RenderGeneration(Config{DNSPort: 5353, Pool: pool}, o, eff)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range g.Sets {
		if strings.HasSuffix(s.Spec.Name, "6") {
			t.Errorf("IPv6 set %s without IPv6", s.Spec.Name)
		}
	}
	if len(g.Elements) != 2 || g.Elements[0].Set != SetDNS4 || g.Elements[1].Set != MapSrc4 {
		t.Errorf("elements without IPv6: %v", g.Elements)
	}
	// Rule 1 drops all IPv6: nfproto ipv6, then the counted drop.
	if c := cmpData(g.Chain.Rules[1].Exprs, expr.CmpOpEq); !bytes.Equal(c, []byte{10}) || last(g.Chain.Rules[1].Exprs).Kind != expr.VerdictDrop {
		t.Errorf("rule 1 does not drop IPv6: %v", g.Chain.Rules[1].Exprs)
	}
}

func TestRenderDenyAll(t *testing.T) {
	o := unitOwner(t, 1)
	g, err := RenderGeneration(Config{DNSPort: 5353, Pool: unitPool}, o, unitEffective(t, o, netpolicy.ModeDenyAll))
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Sets) != 0 || g.Elements != nil || len(g.Counters) != 2 {
		t.Errorf("deny_all has sets %v, elements %v, counters %v", g.Sets, g.Elements, g.Counters)
	}
	if len(g.Chain.Rules) != 1 || len(g.Chain.Rules[0].Exprs) != 2 || last(g.Chain.Rules[0].Exprs).Kind != expr.VerdictDrop {
		t.Errorf("deny_all rules %v", g.Chain.Rules)
	}
}

func TestRenderRefusesBadInput(t *testing.T) {
	o := unitOwner(t, 1)
	eff := unitEffective(t, o, netpolicy.ModeOpen)
	cfg := Config{DNSPort: 5353, Pool: unitPool}
	for name, tc := range map[string]struct {
		cfg Config
		o   netpolicy.Owner
		eff netpolicy.Effective
	}{
		"slot outside the mark mask": {Config{DNSPort: 5353, Pool: unitPool, MarkMask: 0xf0}, o, eff},
		"bad sandbox id":             {cfg, netpolicy.Owner{ID: "a b", Generation: 1, Block: o.Block}, eff},
		"slot 0":                     {cfg, netpolicy.Owner{ID: "a", Generation: 1}, eff},
		"no source":                  {cfg, o, netpolicy.Effective{Mode: netpolicy.ModeOpen}},
	} {
		if _, err := RenderGeneration(tc.cfg, tc.o, tc.eff); !errdefs.Is(err, errdefs.CodeInvalidArgument) {
			t.Errorf("%s: %v, want invalid_argument", name, err)
		}
	}
	for name, c := range map[string]Config{
		"no dns port":   {Pool: unitPool},
		"no pool":       {DNSPort: 53},
		"mask too thin": {DNSPort: 53, Pool: unitPool, MarkMask: 0xff},
		"table name":    {DNSPort: 53, Pool: unitPool, Table: "a b"},
	} {
		if err := c.Check(); !errdefs.Is(err, errdefs.CodeInvalidArgument) {
			t.Errorf("config %s: %v, want invalid_argument", name, err)
		}
	}
	if err := cfg.Check(); err != nil {
		t.Errorf("good config: %v", err)
	}
}

func TestRenderBase(t *testing.T) {
	b := RenderBase(Config{DNSPort: 5353, Pool: unitPool})
	if b.Version != "ctld base v5 dns-port 5353 pool 10.200.0.0/16 fd00:c71d::/64" {
		t.Errorf("version %q", b.Version)
	}
	var chains []string
	for _, c := range b.Chains {
		chains = append(chains, c.Spec.Name)
		if c.Rules[0].Comment != b.Version {
			t.Errorf("chain %s: first rule comment %q", c.Spec.Name, c.Rules[0].Comment)
		}
		if c.Spec.Hooknum == nil || c.Spec.Priority == nil || *c.Spec.Policy != nftables.ChainPolicyAccept {
			t.Errorf("chain %s is not a base chain with policy accept", c.Spec.Name)
		}
	}
	if !slices.Equal(chains, []string{"pre", "input", "forward", "post"}) {
		t.Errorf("chains %v", chains)
	}
	// forward: the dispatch first, through the fwd verdict map.
	fwd := b.Chains[2].Rules[0].Exprs
	if l, ok := fwd[1].(*expr.Lookup); !ok || l.SetName != MapDispatch || !l.IsDestRegSet || l.DestRegister != 0 {
		t.Errorf("forward rule 0 is not the dispatch: %v", fwd)
	}
	// input: first, the proxy's port (udp and tcp) is dropped from any
	// link but the sandboxes' and loopback, before the rule that lets
	// other links' traffic go.
	in := b.Chains[1].Rules
	for i, proto := range []byte{protoUDP, protoTCP} {
		var ifs []string
		var port, l4, dropped bool
		for _, e := range in[i].Exprs {
			switch e := e.(type) {
			case *expr.Cmp:
				switch {
				case e.Op == expr.CmpOpNeq && (string(e.Data) == netpolicy.LinkPrefix || bytes.Equal(e.Data, ifname("lo"))):
					ifs = append(ifs, strings.TrimRight(string(e.Data), "\x00"))
				case bytes.Equal(e.Data, []byte{proto}):
					l4 = true
				case bytes.Equal(e.Data, []byte{0x14, 0xe9}): // 5353
					port = true
				}
			case *expr.Verdict:
				dropped = e.Kind == expr.VerdictDrop
			}
		}
		if !slices.Equal(ifs, []string{netpolicy.LinkPrefix, "lo"}) || !l4 || !port || !dropped {
			t.Errorf("input rule %d does not drop proto %d to the proxy port from other links: links %q l4 %v port %v drop %v", i, proto, ifs, l4, port, dropped)
		}
	}
	if v, ok := in[2].Exprs[len(in[2].Exprs)-1].(*expr.Verdict); !ok || v.Kind != expr.VerdictReturn {
		t.Errorf("input rule 2 is not the return of other links: %v", in[2].Exprs)
	}
	// input: a new flow to the proxy is accepted and marked by the src
	// map of its family (link . source → mark).
	var toProxy []string
	for _, r := range b.Chains[1].Rules {
		for k, e := range r.Exprs {
			l, ok := e.(*expr.Lookup)
			if !ok || !l.IsDestRegSet || k+1 >= len(r.Exprs) {
				continue
			}
			if ct, ok := r.Exprs[k+1].(*expr.Ct); ok && ct.Key == expr.CtKeyMARK && ct.SourceRegister && ct.Register == l.DestRegister {
				toProxy = append(toProxy, l.SetName)
			}
		}
	}
	if !slices.Equal(toProxy, []string{MapSrc4, MapSrc6}) {
		t.Errorf("input marks DNS-proxy flows from %v, want the src maps", toProxy)
	}
	// The kernel walks every generation's chain once per rule that looks
	// the dispatch map up, at each commit that adds a rule: the whole
	// table looks it up once (forward), whatever the number of
	// generations.
	var lookups int
	for _, c := range b.Chains {
		for _, r := range c.Rules {
			for _, e := range r.Exprs {
				if l, ok := e.(*expr.Lookup); ok && l.SetName == MapDispatch {
					lookups++
				}
			}
		}
	}
	if lookups != 1 {
		t.Errorf("the base chains look the dispatch map up %d times, want 1", lookups)
	}
	for _, s := range b.Sets[3:] {
		if !s.Spec.IsMap || s.Spec.DataType != nftables.TypeMark || !s.Spec.Concatenation {
			t.Errorf("%s is not a concatenated map to a mark: %+v", s.Spec.Name, s.Spec)
		}
	}
	// pre: 4 redirects (v4 and v6, udp and tcp) to the proxy port.
	if n := len(b.Chains[0].Rules); n != 4 {
		t.Errorf("pre has %d rules", n)
	}
	// post: masquerade per family of the pool.
	if n := len(b.Chains[3].Rules); n != 2 {
		t.Errorf("post has %d rules, want 2", n)
	}
	if n := len(RenderBase(Config{DNSPort: 5353, Pool: netpolicy.Pool{V4: unitPool.V4}}).Chains[3].Rules); n != 1 {
		t.Errorf("post without IPv6 has %d rules, want 1", n)
	}
	e := FwdElement("ctl-00001", "sb-a-g1")
	if len(e.Key) != 16 || e.VerdictData.Kind != expr.VerdictGoto || e.VerdictData.Chain != "sb-a-g1" {
		t.Errorf("fwd element %+v", e)
	}
}

func cmpData(es []expr.Any, op expr.CmpOp) []byte {
	for _, e := range es {
		if c, ok := e.(*expr.Cmp); ok && c.Op == op {
			return c.Data
		}
	}
	return nil
}

func lookups(es []expr.Any) []string {
	var out []string
	for _, e := range es {
		if l, ok := e.(*expr.Lookup); ok {
			out = append(out, l.SetName)
		}
	}
	return out
}

func objrefs(es []expr.Any) []string {
	var out []string
	for _, e := range es {
		if o, ok := e.(*expr.Objref); ok {
			out = append(out, o.Name)
		}
	}
	return out
}

func last(es []expr.Any) *expr.Verdict {
	if len(es) == 0 {
		return nil
	}
	v, _ := es[len(es)-1].(*expr.Verdict)
	return v
}

func findBitwise(es []expr.Any) *expr.Bitwise {
	for _, e := range es {
		if b, ok := e.(*expr.Bitwise); ok {
			return b
		}
	}
	return nil
}

// inIntervals looks a up in a single-field interval set's elements as the
// kernel's rbtree does: the greatest key not above a decides (a start
// element: inside).
func inIntervals(els []nftables.SetElement, a netip.Addr) bool {
	var best *nftables.SetElement
	for i, e := range els {
		k, _ := netip.AddrFromSlice(e.Key)
		if k.Compare(a) <= 0 {
			if best == nil {
				best = &els[i]
			} else if b, _ := netip.AddrFromSlice(best.Key); k.Compare(b) >= 0 {
				best = &els[i]
			}
		}
	}
	return best != nil && !best.IntervalEnd
}
