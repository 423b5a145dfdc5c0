package nft

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/netpolicy"
)

// Rendering: the table's base objects and a generation's objects as plain
// data (set specs with their elements, rules as expression lists), so the
// code that loads them is a loop and the data is unit-tested on the host.

// Defaults of Config.
const (
	DefaultTable    = "ctld"
	DefaultMarkMask = netpolicy.MaxSlots - 1 // the low 20 bits: every slot fits
)

// BaseVersion is the layout version of the base chains. It is part of the
// comment on the first rule of each base chain; Ensure replaces the base
// rules when the comment differs (a new layout or a new configuration).
const BaseVersion = 5 // 2: DNS-proxy flows go through the generation's chain (marked); 3: in one input rule; 4: marked from the src maps; 5: the proxy port closed to other links

// Names of the base objects.
const (
	ChainPre     = "pre"
	ChainInput   = "input"
	ChainForward = "forward"
	ChainPost    = "post"
	MapDispatch  = "dispatch"
	SetDNS4      = "dns4"
	SetDNS6      = "dns6"
	MapSrc4      = "src4"
	MapSrc6      = "src6"
)

// Config is the node's firewall configuration.
type Config struct {
	// Table is the inet table ctld owns; empty means DefaultTable.
	Table string
	// DNSPort is the DNS proxy's port on the node (udp and tcp): each
	// sandbox's port 53 traffic to its gateway is redirected there.
	DNSPort uint16
	// Pool is the sandbox address pool: its traffic is masqueraded out.
	Pool netpolicy.Pool
	// DomainSetSize is each domain set's size (nft set `size`): the
	// kernel refuses (ENFILE) an add beyond it, so the proxy's answer
	// fails closed. Zero: netpolicy.DomainSetSize.
	DomainSetSize uint32
	// MarkMask is the part of the conntrack mark that holds the slot;
	// zero means DefaultMarkMask. Bits outside it are kept, so other
	// software on the node can use them.
	MarkMask uint32
}

func (c Config) table() string {
	if c.Table == "" {
		return DefaultTable
	}
	return c.Table
}

func (c Config) domainSetSize() uint32 {
	if c.DomainSetSize == 0 {
		return netpolicy.DomainSetSize
	}
	return c.DomainSetSize
}

func (c Config) markMask() uint32 {
	if c.MarkMask == 0 {
		return DefaultMarkMask
	}
	return c.MarkMask
}

// Check validates the configuration; the error is invalid_argument.
func (c Config) Check() error {
	bad := func(format string, args ...any) error {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "firewall config: "+format, args...)
	}
	if c.DNSPort == 0 {
		return bad("no DNS proxy port")
	}
	if err := c.Pool.Check(); err != nil {
		return err
	}
	if n := c.Pool.Len(); n&^c.markMask() != 0 {
		return bad("mark mask %#x does not hold the pool's highest slot %d", c.markMask(), n)
	}
	if t := c.table(); len(t) > 64 || strings.ContainsAny(t, " \x00") {
		return bad("table name %q", t)
	}
	return nil
}

// Set is a set to create with its elements.
type Set struct {
	Spec     nftables.Set // without Table
	Elements []nftables.SetElement
}

// Chain is a chain with its rules (each an expression list).
type Chain struct {
	Spec  nftables.Chain // without Table
	Rules []Rule
}

// Rule is one rule: its expressions and its comment (rule userdata).
type Rule struct {
	Exprs   []expr.Any
	Comment string
}

// Base is the table's base objects.
type Base struct {
	Sets   []Set // dispatch, dns4, dns6, src4, src6 (empty)
	Chains []Chain
	// Version is the comment on the first rule of each base chain.
	Version string
}

// Registers. Register 1 is 16 bytes wide; in a concatenation each field
// takes whole 32-bit registers from NFT_REG32_00 (which aliases register 1).
const (
	regVerdict = 0
	reg1       = 1
	reg32      = 8 // NFT_REG32_00
	regMark    = reg32 + 8
)

// Protocol numbers.
const (
	protoTCP    = unix.IPPROTO_TCP
	protoUDP    = unix.IPPROTO_UDP
	protoICMPv6 = unix.IPPROTO_ICMPV6
)

// ctStatusDNAT is IPS_DST_NAT: the flow was redirected (to the proxy).
const ctStatusDNAT = 1 << 5

// RenderBase returns the table's base chains and sets for c.
func RenderBase(c Config) Base {
	version := fmt.Sprintf("ctld base v%d dns-port %d pool %v", BaseVersion, c.DNSPort, c.Pool.V4)
	if c.Pool.IPv6() {
		version += " " + c.Pool.V6.String()
	}
	b := Base{Version: version}
	b.Sets = []Set{
		// nft prints an ifname key by the byte order the set records
		// (host order for strings); the kernel ignores it.
		{Spec: nftables.Set{Name: MapDispatch, IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict, KeyByteOrder: binaryutil.NativeEndian}},
		{Spec: nftables.Set{Name: SetDNS4, Concatenation: true, KeyType: nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIPAddr)}},
		{Spec: nftables.Set{Name: SetDNS6, Concatenation: true, KeyType: nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIP6Addr)}},
		{Spec: nftables.Set{Name: MapSrc4, IsMap: true, Concatenation: true, KeyType: nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIPAddr), DataType: nftables.TypeMark}},
		{Spec: nftables.Set{Name: MapSrc6, IsMap: true, Concatenation: true, KeyType: nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIP6Addr), DataType: nftables.TypeMark}},
	}
	accept := nftables.ChainPolicyAccept
	port := binaryutil.BigEndian.PutUint16(c.DNSPort)

	// pre: a sandbox's DNS to its gateway goes to the proxy.
	var pre []Rule
	for _, fam := range []struct {
		nfproto byte
		set     string
		daddr   expr.Payload
	}{
		{unix.NFPROTO_IPV4, SetDNS4, daddr4(reg32 + 4)},
		{unix.NFPROTO_IPV6, SetDNS6, daddr6(reg32 + 4)},
	} {
		for _, proto := range []byte{protoUDP, protoTCP} {
			pre = append(pre, Rule{Exprs: concat(
				nfproto(fam.nfproto),
				[]expr.Any{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1}, &fam.daddr,
					&expr.Lookup{SourceRegister: reg1, SetName: fam.set}},
				l4proto(proto),
				dport(53),
				[]expr.Any{&expr.Immediate{Register: reg1, Data: port}, &expr.Redir{RegisterProtoMin: reg1}},
			)})
		}
	}

	// input: the node is closed to sandboxes but for their DNS proxy.
	// The proxy's port is closed to every other link but loopback: the
	// proxy knows a sandbox by its source address, which only a
	// sandbox's own link vouches for (its generation's src element); a
	// peer on the uplink's segment sending from a pool address would
	// otherwise be served as that sandbox. Loopback is the node's own
	// processes (root can spoof there anyway; a probe asks from there).
	var input []Rule
	for _, proto := range []byte{protoUDP, protoTCP} {
		input = append(input, Rule{Exprs: concat(ifPrefix(expr.MetaKeyIIFNAME, expr.CmpOpNeq),
			[]expr.Any{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1}, &expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: ifname("lo")}},
			l4proto(proto), dport(c.DNSPort), []expr.Any{&expr.Counter{}}, verdict(expr.VerdictDrop))})
	}
	input = append(input, []Rule{
		{Exprs: concat(ifPrefix(expr.MetaKeyIIFNAME, expr.CmpOpNeq), verdict(expr.VerdictReturn))},
		{Exprs: concat(ctEstablished(), verdict(expr.VerdictAccept))},
		{Exprs: concat(nfproto(unix.NFPROTO_IPV6), l4proto(protoICMPv6),
			[]expr.Any{
				&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
				&expr.Range{Op: expr.CmpOpEq, Register: reg1, FromData: []byte{135}, ToData: []byte{136}}, // neighbour solicit, advert
				&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: 7, Len: 1}, // hop limit
				&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{255}},
			}, verdict(expr.VerdictAccept))},
	}...)
	// A new flow to the proxy is accepted when its link and source
	// address are a generation's (anti-spoofing by the key; a carrier or
	// a deny_all generation has no element and falls through to the
	// drop), and marked with that generation's slot (so the release's
	// flush and conntrack_gone cover DNS-proxy flows too). A data map and
	// not the dispatch verdict map: the kernel validates, on every commit
	// that adds a rule, each chain a verdict map reaches once per rule
	// that looks it up, so each such rule would cost a walk of every
	// generation's chain on every apply. The map's value is the whole
	// mark: a flow that ends in ctld's own proxy keeps no other bits.
	for _, fam := range []struct {
		nfproto byte
		set     string
		saddr   expr.Payload
	}{
		{unix.NFPROTO_IPV4, MapSrc4, saddr4(reg32 + 4)},
		{unix.NFPROTO_IPV6, MapSrc6, saddr6(reg32 + 4)},
	} {
		input = append(input, Rule{Exprs: concat(nfproto(fam.nfproto), dport(c.DNSPort), ctDNAT(),
			[]expr.Any{
				&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1}, &fam.saddr,
				&expr.Lookup{SourceRegister: reg1, SetName: fam.set, DestRegister: regMark, IsDestRegSet: true},
				&expr.Ct{Key: expr.CtKeyMARK, Register: regMark, SourceRegister: true},
			}, verdict(expr.VerdictAccept))})
	}
	input = append(input, Rule{Exprs: concat([]expr.Any{&expr.Counter{}}, verdict(expr.VerdictDrop))})

	// forward: a sandbox's own traffic goes to its generation's chain
	// first (which accepts its established flows and counts them); the
	// replies come back through the established rule.
	forward := []Rule{
		{Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1},
			&expr.Lookup{SourceRegister: reg1, SetName: MapDispatch, DestRegister: regVerdict, IsDestRegSet: true},
		}},
		{Exprs: concat(ctEstablished(), verdict(expr.VerdictAccept))},
		{Exprs: concat(ifPrefix(expr.MetaKeyIIFNAME, expr.CmpOpEq), []expr.Any{&expr.Counter{}}, verdict(expr.VerdictDrop))},
		{Exprs: concat(ifPrefix(expr.MetaKeyOIFNAME, expr.CmpOpEq), verdict(expr.VerdictDrop))},
	}

	// post: the pool leaves the node masqueraded.
	post := []Rule{{Exprs: concat(ifPrefix(expr.MetaKeyOIFNAME, expr.CmpOpNeq), nfproto(unix.NFPROTO_IPV4),
		inPrefix(saddr4(reg1), c.Pool.V4), []expr.Any{&expr.Masq{}})}}
	if c.Pool.IPv6() {
		post = append(post, Rule{Exprs: concat(ifPrefix(expr.MetaKeyOIFNAME, expr.CmpOpNeq), nfproto(unix.NFPROTO_IPV6),
			inPrefix(saddr6(reg1), c.Pool.V6), []expr.Any{&expr.Masq{}})})
	}

	b.Chains = []Chain{
		{Spec: nftables.Chain{Name: ChainPre, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &accept}, Rules: pre},
		{Spec: nftables.Chain{Name: ChainInput, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept}, Rules: input},
		{Spec: nftables.Chain{Name: ChainForward, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept}, Rules: forward},
		{Spec: nftables.Chain{Name: ChainPost, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept}, Rules: post},
	}
	for i := range b.Chains {
		b.Chains[i].Rules[0].Comment = version
	}
	return b
}

// Generation is one generation's objects.
type Generation struct {
	Chain    Chain
	Link     string   // the dispatch element's key: the host end of the veth
	Counters []string // named counters: tx, drop
	Sets     []Set
	// Elements are the generation's elements in the base sets keyed by
	// its link (linkKeys): none for deny_all.
	Elements []Element
	Mark     uint32
}

// Element is an element of a base set or map: Val is a map's data.
type Element struct {
	Set      string
	Key, Val []byte
}

// LinkKey is where a generation has an element in a base set: the key
// is its link . Addr, an address of its slot's block.
type LinkKey struct {
	Set  string
	Addr netip.Addr
}

// linkKeys are the base sets keyed by a link and an address of b: the DNS
// proxy's redirect (link . gateway) and its input rule (link . the
// sandbox's address → mark). A family b has no address in is left out.
func linkKeys(b netpolicy.Block) []LinkKey {
	var out []LinkKey
	for _, k := range []LinkKey{{SetDNS4, b.Gateway4}, {MapSrc4, b.Addr4}, {SetDNS6, b.Gateway6}, {MapSrc6, b.Addr6}} {
		if k.Addr.IsValid() {
			out = append(out, k)
		}
	}
	return out
}

// linkedSets names the base sets keyed by a link (linkKeys).
func linkedSets() []string { return []string{SetDNS4, MapSrc4, SetDNS6, MapSrc6} }

// key is the element key of link in k's set.
func (k LinkKey) key(link string) []byte { return append(ifname(link), k.Addr.AsSlice()...) }

// Counter and set suffixes (netpolicy.SetName).
const (
	suffixTx   = "tx"
	suffixDrop = "drop"
)

// DomainSetName is the set that holds the answers of eff.Domains[i] in
// one family.
func DomainSetName(o netpolicy.Owner, i int, v6 bool) string {
	fam := "4"
	if v6 {
		fam = "6"
	}
	return netpolicy.SetName(o.ID, o.Generation, fmt.Sprintf("d%d-%s", i, fam))
}

// domainComment marks a domain rule with its set and the profile it was
// made for, so a replace keeps a domain set's resolved elements only when
// its profile is unchanged.
func domainComment(set string, d netpolicy.DomainSet) string {
	return fmt.Sprintf("ctld domains %s %s %v %s", set, d.Proto, d.Ports, strings.Join(d.Names, ","))
}

// RenderGeneration returns o's objects enforcing eff.
func RenderGeneration(c Config, o netpolicy.Owner, eff netpolicy.Effective) (Generation, error) {
	bad := func(format string, args ...any) (Generation, error) {
		return Generation{}, errdefs.Errorf(errdefs.CodeInvalidArgument, "firewall %s: "+format, append([]any{o.Chain()}, args...)...)
	}
	if _, _, ok := netpolicy.ParseChainName(o.Chain()); !ok {
		return bad("not a generation name")
	}
	if _, ok := netpolicy.ParseLinkName(o.Link()); !ok {
		return bad("slot %d", o.Block.Slot)
	}
	if uint32(o.Block.Slot)&^c.markMask() != 0 {
		return bad("slot %d does not fit the mark mask %#x", o.Block.Slot, c.markMask())
	}
	if !eff.Source4.Is4() {
		return bad("no IPv4 source address")
	}
	if eff.Source6.IsValid() && !eff.Source6.Is6() {
		return bad("IPv6 source %v", eff.Source6)
	}
	name := func(what string) string { return netpolicy.SetName(o.ID, o.Generation, what) }
	g := Generation{
		Link:     o.Link(),
		Counters: []string{name(suffixTx), name(suffixDrop)},
		Mark:     uint32(o.Block.Slot),
	}
	tx, drop := objref(name(suffixTx)), objref(name(suffixDrop))
	g.Chain.Spec = nftables.Chain{Name: o.Chain()}
	add := func(comment string, e ...[]expr.Any) {
		g.Chain.Rules = append(g.Chain.Rules, Rule{Exprs: concat(e...), Comment: comment})
	}
	dropAll := concat([]expr.Any{drop}, verdict(expr.VerdictDrop))
	if eff.Mode == netpolicy.ModeDenyAll {
		add("", dropAll)
		return g, nil
	}
	v6 := eff.Source6.IsValid()

	// Anti-spoofing first: nothing below trusts a source address.
	add("", nfproto(unix.NFPROTO_IPV4), []expr.Any{&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: eff.Source4.AsSlice()}}, dropAll)
	if v6 {
		add("", nfproto(unix.NFPROTO_IPV6), []expr.Any{&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: 8, Len: 16},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: eff.Source6.AsSlice()}}, dropAll)
	} else {
		add("", nfproto(unix.NFPROTO_IPV6), dropAll)
	}
	// Flows this chain accepted before (and a replace kept) go on.
	add("", ctEstablished(), []expr.Any{tx}, verdict(expr.VerdictAccept))
	// The slot in the conntrack mark finds the generation's flows.
	add("", []expr.Any{
		&expr.Ct{Key: expr.CtKeyMARK, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(^c.markMask()), Xor: binaryutil.NativeEndian.PutUint32(g.Mark)},
		&expr.Ct{Key: expr.CtKeyMARK, Register: reg1, SourceRegister: true},
	})
	// Reserved ranges before the allow and domain sets.
	for _, f := range []struct {
		v6      bool
		nfproto byte
		ranges  []netpolicy.AddrRange
		daddr   expr.Payload
	}{
		{false, unix.NFPROTO_IPV4, eff.Deny4, daddr4(reg1)},
		{true, unix.NFPROTO_IPV6, eff.Deny6, daddr6(reg1)},
	} {
		if len(f.ranges) == 0 || (f.v6 && !v6) {
			continue
		}
		s := Set{Spec: nftables.Set{Name: name(famName("x", f.v6)), Interval: true, KeyType: addrType(f.v6)}}
		s.Elements = intervalElements(f.ranges)
		g.Sets = append(g.Sets, s)
		add("", nfproto(f.nfproto), []expr.Any{&f.daddr, &expr.Lookup{SourceRegister: reg1, SetName: s.Spec.Name}}, dropAll)
	}
	// The allow sets: destination . protocol . port intervals.
	for _, f := range []struct {
		v6      bool
		nfproto byte
		elems   []netpolicy.Element
	}{
		{false, unix.NFPROTO_IPV4, eff.Allow4},
		{true, unix.NFPROTO_IPV6, eff.Allow6},
	} {
		if len(f.elems) == 0 || (f.v6 && !v6) {
			continue
		}
		s := Set{Spec: nftables.Set{Name: name(famName("a", f.v6)), Interval: true, Concatenation: true,
			KeyType: nftables.MustConcatSetType(addrType(f.v6), nftables.TypeInetProto, nftables.TypeInetService)}}
		for _, e := range f.elems {
			s.Elements = append(s.Elements, nftables.SetElement{Key: e.Key(), KeyEnd: e.KeyEnd()})
		}
		g.Sets = append(g.Sets, s)
		daddr, next := daddr4(reg1), uint32(reg32+1)
		if f.v6 {
			daddr, next = daddr6(reg1), reg32+4
		}
		add("", nfproto(f.nfproto), []expr.Any{&daddr,
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: next},
			&expr.Payload{DestRegister: next + 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Lookup{SourceRegister: reg1, SetName: s.Spec.Name}, tx}, verdict(expr.VerdictAccept))
	}
	// Domain sets: the DNS proxy adds answers with a timeout.
	for i, d := range eff.Domains {
		proto := byte(protoTCP)
		if d.Proto == netpolicy.ProtoUDP {
			proto = protoUDP
		}
		for _, f := range []struct {
			v6      bool
			nfproto byte
			daddr   expr.Payload
		}{
			{false, unix.NFPROTO_IPV4, daddr4(reg1)},
			{true, unix.NFPROTO_IPV6, daddr6(reg1)},
		} {
			if f.v6 && !v6 {
				continue
			}
			s := Set{Spec: nftables.Set{Name: DomainSetName(o, i, f.v6), HasTimeout: true, KeyType: addrType(f.v6), Size: c.domainSetSize()}}
			g.Sets = append(g.Sets, s)
			for _, pr := range d.Ports {
				add(domainComment(s.Spec.Name, d), nfproto(f.nfproto),
					[]expr.Any{&f.daddr, &expr.Lookup{SourceRegister: reg1, SetName: s.Spec.Name}},
					l4proto(proto), dportRange(pr), []expr.Any{tx}, verdict(expr.VerdictAccept))
			}
		}
	}
	// A goto'd chain that ends returns to the base chain's policy
	// (accept): the last rule drops explicitly.
	add("", dropAll)

	// The DNS proxy: redirected to (pre) and accepted, marked (input),
	// in each family the policy gives it.
	mark := binaryutil.NativeEndian.PutUint32(g.Mark)
	for _, f := range []struct {
		dns, src     netip.Addr
		redir, input string
	}{{eff.DNS4, eff.Source4, SetDNS4, MapSrc4}, {eff.DNS6, eff.Source6, SetDNS6, MapSrc6}} {
		if !f.dns.IsValid() || !f.src.IsValid() || f.dns.Is4() != f.src.Is4() {
			continue
		}
		g.Elements = append(g.Elements,
			Element{Set: f.redir, Key: LinkKey{f.redir, f.dns}.key(g.Link)},
			Element{Set: f.input, Key: LinkKey{f.input, f.src}.key(g.Link), Val: mark})
	}
	return g, nil
}

// FwdElement is the dispatch element: link → goto chain.
func FwdElement(link, chain string) nftables.SetElement {
	return nftables.SetElement{Key: ifname(link), VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain}}
}

// intervalElements are the elements of a single-field interval set (the
// kernel's rbtree): a start element per range and an end element one past
// its last address (none when the range reaches the family's end).
func intervalElements(rs []netpolicy.AddrRange) []nftables.SetElement {
	var out []nftables.SetElement
	for _, r := range rs {
		out = append(out, nftables.SetElement{Key: r.From.AsSlice()})
		if n := r.To.Next(); n.IsValid() {
			out = append(out, nftables.SetElement{Key: n.AsSlice(), IntervalEnd: true})
		}
	}
	return out
}

func famName(p string, v6 bool) string {
	if v6 {
		return p + "6"
	}
	return p + "4"
}

func addrType(v6 bool) nftables.SetDatatype {
	if v6 {
		return nftables.TypeIP6Addr
	}
	return nftables.TypeIPAddr
}

func concat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }

func objref(name string) expr.Any {
	return &expr.Objref{Type: int(nftables.ObjTypeCounter), Name: name}
}

func nfproto(p byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg1}, &expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{p}}}
}

func l4proto(p byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1}, &expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{p}}}
}

func dport(p uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binaryutil.BigEndian.PutUint16(p)},
	}
}

func dportRange(pr netpolicy.PortRange) []expr.Any {
	if pr.From == pr.To {
		return dport(pr.From)
	}
	return []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Range{Op: expr.CmpOpEq, Register: reg1, FromData: binaryutil.BigEndian.PutUint16(pr.From), ToData: binaryutil.BigEndian.PutUint16(pr.To)},
	}
}

// ifPrefix matches (or, with CmpOpNeq, refuses) the links named
// netpolicy.LinkPrefix*: the comparison covers only the prefix's bytes.
func ifPrefix(key expr.MetaKey, op expr.CmpOp) []expr.Any {
	return []expr.Any{&expr.Meta{Key: key, Register: reg1}, &expr.Cmp{Op: op, Register: reg1, Data: []byte(netpolicy.LinkPrefix)}}
}

// ctDNAT matches a flow that was redirected (to the proxy).
func ctDNAT() []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATUS, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(ctStatusDNAT), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: make([]byte, 4)},
	}
}

func ctEstablished() []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: make([]byte, 4)},
	}
}

func daddr4(reg uint32) expr.Payload {
	return expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4}
}

func daddr6(reg uint32) expr.Payload {
	return expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: 24, Len: 16}
}

func saddr4(reg uint32) expr.Payload {
	return expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4}
}

func saddr6(reg uint32) expr.Payload {
	return expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: 8, Len: 16}
}

// inPrefix matches the loaded address against p.
func inPrefix(load expr.Payload, p netip.Prefix) []expr.Any {
	n := len(p.Addr().AsSlice())
	mask := make([]byte, n)
	for i := 0; i < p.Bits(); i++ {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	return []expr.Any{&load,
		&expr.Bitwise{SourceRegister: load.DestRegister, DestRegister: load.DestRegister, Len: uint32(n), Mask: mask, Xor: make([]byte, n)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: load.DestRegister, Data: p.Masked().Addr().AsSlice()}}
}

// ifname is a link name as the kernel keys it: IFNAMSIZ bytes, zero padded.
func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

// comment is a rule's userdata carrying c as its comment (nft shows it).
func comment(c string) []byte {
	if c == "" {
		return nil
	}
	return userdata.AppendString(nil, userdata.TypeComment, c)
}

func commentOf(ud []byte) string {
	s, _ := userdata.GetString(ud, userdata.TypeComment)
	return s
}

// linkOfKey is the link name in an element key that starts with one.
func linkOfKey(k []byte) string {
	if len(k) > unix.IFNAMSIZ {
		k = k[:unix.IFNAMSIZ]
	}
	if i := strings.IndexByte(string(k), 0); i >= 0 {
		k = k[:i]
	}
	return string(k)
}
