package netpolicy

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/ctld/ctld/internal/names"
)

// Names of a generation's network objects, and the key bytes of its allow
// set elements: plain data shared by the code that makes the objects, the
// cleanup proof that checks them and the reconciler that finds them
// (docs/network-design.md).

// LinkPrefix starts the host end of every sandbox veth. Link names are at
// most 15 bytes, too short for a generation name, so the link is named by
// its address slot and carries the generation name as its alias.
const LinkPrefix = "ctl-"

// ChainPrefix starts every per-generation nft object name.
const ChainPrefix = "sb-"

// LinkName is the host end of slot's veth: "ctl-" and the slot in five
// hex digits (slots are below 2^20).
func LinkName(s Slot) string { return fmt.Sprintf("%s%05x", LinkPrefix, uint32(s)) }

// ParseLinkName is the inverse of LinkName.
func ParseLinkName(name string) (Slot, bool) {
	hex, ok := strings.CutPrefix(name, LinkPrefix)
	if !ok || len(hex) != 5 || strings.ToLower(hex) != hex {
		return 0, false
	}
	n, err := strconv.ParseUint(hex, 16, 32)
	if err != nil || n == 0 || n >= MaxSlots {
		return 0, false
	}
	return Slot(n), true
}

// ChainName is generation gen of sandbox id's chain, "sb-<id>-g<gen>";
// its sets and counters are the chain name plus a suffix (SetName).
func ChainName(id string, gen uint64) string { return ChainPrefix + names.Generation(id, gen) }

// ParseChainName is the inverse of ChainName: it also accepts the name of
// one of the generation's sets or counters (a suffix after the chain
// name), so the reconciler can tell the owner of any object it lists.
func ParseChainName(name string) (id string, gen uint64, ok bool) {
	rest, ok := strings.CutPrefix(name, ChainPrefix)
	if !ok {
		return "", 0, false
	}
	if i := strings.IndexByte(rest, '.'); i >= 0 {
		rest = rest[:i]
	}
	return names.ParseGeneration(rest)
}

// SetName names one of a generation's sets or counters: the chain name,
// '.', and what it is ("a4", "x6", "d0-4", "tx"). A '.' cannot occur in a
// generation name, so the owner is never ambiguous.
func SetName(id string, gen uint64, what string) string { return ChainName(id, gen) + "." + what }

// Key and KeyEnd are an allow set element's bytes for the set type
// "ipv4_addr . inet_proto . inet_service" (or ipv6_addr): each field in
// network byte order, padded with zeros to a multiple of 4 bytes as the
// kernel lays out concatenations in its registers.
func (e Element) Key() []byte { return elementKey(e.Dst.From, e.Proto, e.Ports.From) }

// KeyEnd is the inclusive end of the element's range.
func (e Element) KeyEnd() []byte { return elementKey(e.Dst.To, e.Proto, e.Ports.To) }

func elementKey(a netip.Addr, proto Proto, port uint16) []byte {
	b := append([]byte(nil), a.AsSlice()...)
	b = append(b, protoNumber(proto), 0, 0, 0)
	return append(b, byte(port>>8), byte(port), 0, 0)
}

func protoNumber(p Proto) byte {
	switch p {
	case ProtoTCP:
		return 6
	case ProtoUDP:
		return 17
	}
	return 0
}

// ParseElement reads an element back from its key bytes (as the kernel
// lists it), so the proof and the reconciler can compare the kernel's set
// with the journaled policy.
func ParseElement(key, keyEnd []byte) (Element, error) {
	from, proto, pfrom, err := parseKey(key)
	if err != nil {
		return Element{}, err
	}
	to, proto2, pto, err := parseKey(keyEnd)
	if err != nil {
		return Element{}, err
	}
	if proto2 != proto || from.BitLen() != to.BitLen() || to.Less(from) || pto < pfrom {
		return Element{}, fmt.Errorf("set element %x-%x: the end does not match the start", key, keyEnd)
	}
	return Element{AddrRange{from, to}, proto, PortRange{pfrom, pto}}, nil
}

func parseKey(b []byte) (netip.Addr, Proto, uint16, error) {
	var alen int
	switch len(b) {
	case 4 + 8:
		alen = 4
	case 16 + 8:
		alen = 16
	default:
		return netip.Addr{}, "", 0, fmt.Errorf("set element key %x: %d bytes, want 12 or 24", b, len(b))
	}
	a, _ := netip.AddrFromSlice(b[:alen])
	var proto Proto
	switch b[alen] {
	case 6:
		proto = ProtoTCP
	case 17:
		proto = ProtoUDP
	default:
		return netip.Addr{}, "", 0, fmt.Errorf("set element key %x: protocol %d is not tcp or udp", b, b[alen])
	}
	return a, proto, uint16(b[alen+4])<<8 | uint16(b[alen+5]), nil
}
