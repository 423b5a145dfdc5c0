package netpolicy

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/ctld/ctld/internal/errdefs"
)

// The address pool: each sandbox generation gets one block of the node's
// pool, an IPv4 /31 (or /30) and, if IPv6 is enabled, an IPv6 /126 (or
// /127) of the same index carved from one ULA prefix. The node side of the
// veth takes the block's gateway address (the sandbox's default route and
// its DNS proxy), the netns side the sandbox address.
//
// A block is named by its Slot, a small integer kept in the generation's
// journal record like the disk project id: it is allocated inside the
// claim's journal transaction (Alloc over the slots of every live or
// withheld generation), so two claims never share one, and it is reused
// only after a clean cleanup proof released the generation that held it.
// Slot 0 is never handed out: it is the zero value of a record without an
// address, and it keeps the pool's first addresses (often the network's
// own, or an anycast address) out of use.

// Slot is the index of a block in the pool; 0 is "none".
type Slot uint32

// MaxSlots bounds a pool, so Alloc's scan and the per-sandbox objects stay
// small whatever the prefix lengths.
const MaxSlots = 1 << 20

// Defaults of Pool.
const (
	DefaultV4Bits = 31  // RFC 3021 point-to-point: gateway and sandbox
	DefaultV6Bits = 126 // ::0 left out (subnet-router anycast), ::1 gateway, ::2 sandbox
)

// Pool is the node's sandbox address pool (configuration).
type Pool struct {
	// V4 is where the IPv4 blocks come from. It must not overlap any
	// network the node reaches: every address in it is "another sandbox".
	V4 netip.Prefix
	// V4Bits is the block size: 31 (zero: DefaultV4Bits) or 30.
	V4Bits int
	// V6 is a ULA prefix (fc00::/7) for the IPv6 blocks; the zero prefix
	// disables IPv6 (the sandbox gets none, and its IPv6 is dropped).
	V6 netip.Prefix
	// V6Bits is the IPv6 block size: 126 (zero: DefaultV6Bits) or 127.
	V6Bits int
}

var ula = netip.MustParsePrefix("fc00::/7")

func (p Pool) v4Bits() int {
	if p.V4Bits == 0 {
		return DefaultV4Bits
	}
	return p.V4Bits
}

func (p Pool) v6Bits() int {
	if p.V6Bits == 0 {
		return DefaultV6Bits
	}
	return p.V6Bits
}

// IPv6 reports whether the pool hands out IPv6 blocks.
func (p Pool) IPv6() bool { return p.V6.IsValid() }

// Check validates the configuration; the error is invalid_argument.
func (p Pool) Check() error {
	bad := func(format string, args ...any) error {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "address pool: "+format, args...)
	}
	switch {
	case !p.V4.IsValid() || !p.V4.Addr().Is4():
		return bad("v4 prefix %v is not an IPv4 prefix", p.V4)
	case p.V4 != p.V4.Masked():
		return bad("v4 prefix %v has host bits set (want %v)", p.V4, p.V4.Masked())
	case p.v4Bits() != 30 && p.v4Bits() != 31:
		return bad("v4 block size /%d: must be /31 or /30", p.V4Bits)
	case p.V4.Bits() >= p.v4Bits():
		return bad("v4 prefix %v holds fewer than two /%d blocks", p.V4, p.v4Bits())
	}
	if !p.IPv6() {
		if p.V6Bits != 0 {
			return bad("v6 block size set but no v6 prefix")
		}
		return nil
	}
	switch {
	case !p.V6.Addr().Is6() || p.V6.Addr().Is4In6():
		return bad("v6 prefix %v is not an IPv6 prefix", p.V6)
	case p.V6 != p.V6.Masked():
		return bad("v6 prefix %v has host bits set (want %v)", p.V6, p.V6.Masked())
	case p.V6.Bits() < ula.Bits() || !ula.Contains(p.V6.Addr()):
		return bad("v6 prefix %v is not inside the ULA range %v", p.V6, ula)
	case p.v6Bits() != 126 && p.v6Bits() != 127:
		return bad("v6 block size /%d: must be /126 or /127", p.V6Bits)
	case p.V6.Bits() >= p.v6Bits():
		return bad("v6 prefix %v holds fewer than two /%d blocks", p.V6, p.v6Bits())
	}
	return nil
}

// Len is the number of slots the pool hands out, 1..Len: the blocks of
// the smaller family less slot 0, at most MaxSlots-1.
func (p Pool) Len() uint32 {
	n := blocks(p.v4Bits() - p.V4.Bits())
	if p.IPv6() {
		n = min(n, blocks(p.v6Bits()-p.V6.Bits()))
	}
	return uint32(n - 1)
}

// blocks is 2^shift, capped at MaxSlots.
func blocks(shift int) uint64 {
	if shift >= 20 {
		return MaxSlots
	}
	return 1 << shift
}

// Block is the addresses of one slot. The gateway is the node side of the
// veth; Addr is the sandbox's, its only allowed source address.
type Block struct {
	Slot            Slot
	Net4            netip.Prefix
	Gateway4, Addr4 netip.Addr
	Net6            netip.Prefix // zero when IPv6 is disabled
	Gateway6, Addr6 netip.Addr
}

// Block returns the addresses of slot s.
func (p Pool) Block(s Slot) (Block, error) {
	if err := p.Check(); err != nil {
		return Block{}, err
	}
	if s < 1 || uint32(s) > p.Len() {
		return Block{}, errdefs.Errorf(errdefs.CodeInvalidArgument, "address slot %d is outside the pool's 1..%d", s, p.Len())
	}
	b := Block{Slot: s}
	base4 := binary.BigEndian.Uint32(p.V4.Addr().AsSlice())
	n4 := base4 + uint32(s)<<(32-p.v4Bits())
	b.Net4 = netip.PrefixFrom(addr4(n4), p.v4Bits())
	if p.v4Bits() == 31 {
		b.Gateway4, b.Addr4 = addr4(n4), addr4(n4+1)
	} else { // /30: network, gateway, sandbox, broadcast
		b.Gateway4, b.Addr4 = addr4(n4+1), addr4(n4+2)
	}
	if p.IPv6() {
		hi, lo := u128(p.V6.Addr())
		net6 := addr6(hi, lo+uint64(s)<<(128-p.v6Bits())) // no carry, see SlotOf
		b.Net6 = netip.PrefixFrom(net6, p.v6Bits())
		if p.v6Bits() == 127 {
			b.Gateway6, b.Addr6 = net6, net6.Next()
		} else { // /126: ::0 anycast, ::1 gateway, ::2 sandbox, ::3 unused
			b.Gateway6, b.Addr6 = net6.Next(), net6.Next().Next()
		}
	}
	return b, nil
}

// Alloc returns the lowest slot not in used (the slots of every
// generation that still holds one: live, half made, or withheld for want
// of a proof). A full pool is capacity_exhausted.
func (p Pool) Alloc(used []Slot) (Slot, error) {
	taken := make(map[Slot]bool, len(used))
	for _, s := range used {
		taken[s] = true
	}
	for s := Slot(1); uint32(s) <= p.Len(); s++ {
		if !taken[s] {
			return s, nil
		}
	}
	return 0, errdefs.Errorf(errdefs.CodeCapacityExhausted, "no free address block in the pool %s (%d blocks)", p, p.Len())
}

// SlotOf returns the slot whose block holds a (either family), so the
// reconciler can tell which generation an address it found belongs to.
// Addresses of the pool outside any slot (slot 0, the blocks past Len) are
// not a slot.
func (p Pool) SlotOf(a netip.Addr) (Slot, bool) {
	var off uint64
	switch {
	case a.Is4() && p.V4.Contains(a):
		off = uint64(binary.BigEndian.Uint32(a.AsSlice())-binary.BigEndian.Uint32(p.V4.Addr().AsSlice())) >> (32 - p.v4Bits())
	case a.Is6() && p.IPv6() && p.V6.Contains(a):
		// The slots span fewer than 2^22 addresses from an aligned base,
		// so they never leave the base's high word.
		hi, lo := u128(a)
		baseHi, baseLo := u128(p.V6.Addr())
		if hi != baseHi {
			return 0, false
		}
		off = (lo - baseLo) >> (128 - p.v6Bits())
	default:
		return 0, false
	}
	if off < 1 || off > uint64(p.Len()) {
		return 0, false
	}
	return Slot(off), true
}

func (p Pool) String() string {
	s := fmt.Sprintf("%v per /%d", p.V4, p.v4Bits())
	if p.IPv6() {
		s += fmt.Sprintf(", %v per /%d", p.V6, p.v6Bits())
	}
	return s
}

func addr4(n uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], n)
	return netip.AddrFrom4(b)
}

func u128(a netip.Addr) (hi, lo uint64) {
	b := a.As16()
	return binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
}

func addr6(hi, lo uint64) netip.Addr {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], hi)
	binary.BigEndian.PutUint64(b[8:], lo)
	return netip.AddrFrom16(b)
}
