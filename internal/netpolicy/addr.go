package netpolicy

import (
	"cmp"
	"net/netip"
	"slices"
)

// AddrRange is an inclusive range of addresses of one family: what an nft
// interval set element holds (a CIDR is a range; a range need not be a
// CIDR).
type AddrRange struct {
	From, To netip.Addr
}

func (r AddrRange) String() string {
	if r.From == r.To {
		return r.From.String()
	}
	if p, ok := r.Prefix(); ok {
		return p.String()
	}
	return r.From.String() + "-" + r.To.String()
}

// Prefix reports whether the range is exactly one CIDR, and which.
func (r AddrRange) Prefix() (netip.Prefix, bool) {
	for bits := 0; bits <= r.From.BitLen(); bits++ {
		p := netip.PrefixFrom(r.From, bits)
		if p.Masked().Addr() == r.From && lastAddr(p) == r.To {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

// Contains reports whether a is in the range.
func (r AddrRange) Contains(a netip.Addr) bool {
	return r.From.BitLen() == a.BitLen() && r.From.Compare(a) <= 0 && a.Compare(r.To) <= 0
}

// rangeOf is the range a prefix covers.
func rangeOf(p netip.Prefix) AddrRange {
	p = p.Masked()
	return AddrRange{p.Addr(), lastAddr(p)}
}

// lastAddr is the highest address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As16()
	off := 0
	if p.Addr().Is4() {
		off = 12
	}
	for i := off*8 + p.Bits(); i < 128; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a := netip.AddrFrom16(b)
	if p.Addr().Is4() {
		return a.Unmap()
	}
	return a
}

// within reports whether inner lies wholly inside outer (same family).
func within(inner, outer AddrRange) bool {
	return inner.From.BitLen() == outer.From.BitLen() &&
		outer.From.Compare(inner.From) <= 0 && inner.To.Compare(outer.To) <= 0
}

// subtract returns rs less b; the result keeps rs's order.
func subtract(rs []AddrRange, b AddrRange) []AddrRange {
	var out []AddrRange
	for _, r := range rs {
		if r.From.BitLen() != b.From.BitLen() || r.To.Less(b.From) || b.To.Less(r.From) {
			out = append(out, r) // disjoint
			continue
		}
		if r.From.Less(b.From) {
			out = append(out, AddrRange{r.From, b.From.Prev()})
		}
		if b.To.Less(r.To) {
			out = append(out, AddrRange{b.To.Next(), r.To})
		}
	}
	return out
}

// union returns the ranges sorted, with overlapping and adjacent ones
// merged (one family).
func union(rs []AddrRange) []AddrRange {
	if len(rs) == 0 {
		return nil
	}
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b AddrRange) int { return cmp.Or(a.From.Compare(b.From), a.To.Compare(b.To)) })
	out := rs[:1]
	for _, r := range rs[1:] {
		last := &out[len(out)-1]
		next := last.To.Next() // invalid after the family's last address
		if r.From.Compare(last.To) <= 0 || next.IsValid() && r.From == next {
			if last.To.Less(r.To) {
				last.To = r.To
			}
			continue
		}
		out = append(out, r)
	}
	return out
}
