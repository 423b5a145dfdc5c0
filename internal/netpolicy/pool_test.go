package netpolicy

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/errdefs"
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func ip(s string) netip.Addr    { return netip.MustParseAddr(s) }

func TestPoolCheck(t *testing.T) {
	cases := []struct {
		pool Pool
		want string // "" = valid
	}{
		{Pool{V4: pfx("10.200.0.0/16")}, ""},
		{Pool{V4: pfx("10.200.0.0/16"), V4Bits: 30, V6: pfx("fd12:3456:789a:1::/64"), V6Bits: 127}, ""},
		{Pool{V4: pfx("10.200.0.0/30")}, ""}, // two /31 blocks: slot 1 only
		{Pool{}, "not an IPv4 prefix"},
		{Pool{V4: pfx("fd00::/64")}, "not an IPv4 prefix"},
		{Pool{V4: pfx("10.200.0.1/16")}, "host bits set"},
		{Pool{V4: pfx("10.200.0.0/16"), V4Bits: 29}, "must be /31 or /30"},
		{Pool{V4: pfx("10.200.0.0/16"), V4Bits: 32}, "must be /31 or /30"},
		{Pool{V4: pfx("10.200.0.0/31")}, "fewer than two /31 blocks"},
		{Pool{V4: pfx("10.200.0.0/30"), V4Bits: 30}, "fewer than two /30 blocks"},
		{Pool{V4: pfx("10.200.0.0/16"), V6Bits: 126}, "no v6 prefix"},
		{Pool{V4: pfx("10.200.0.0/16"), V6: pfx("2001:db8::/64")}, "not inside the ULA range"},
		{Pool{V4: pfx("10.200.0.0/16"), V6: pfx("::/0")}, "not inside the ULA range"},
		{Pool{V4: pfx("10.200.0.0/16"), V6: pfx("10.0.0.0/8")}, "not an IPv6 prefix"},
		{Pool{V4: pfx("10.200.0.0/16"), V6: pfx("fd00::1/64")}, "host bits set"},
		{Pool{V4: pfx("10.200.0.0/16"), V6: pfx("fd00::/64"), V6Bits: 125}, "must be /126 or /127"},
		{Pool{V4: pfx("10.200.0.0/16"), V6: pfx("fd00::/126")}, "fewer than two /126 blocks"},
	}
	for _, c := range cases {
		err := c.pool.Check()
		if c.want == "" {
			if err != nil {
				t.Errorf("%+v: %v", c.pool, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.want) || errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
			t.Errorf("%+v: %v, want invalid_argument containing %q", c.pool, err, c.want)
		}
	}
}

// TestPoolBlocks: each slot's addresses, v4 /31 and /30, v6 /126 and /127,
// and that SlotOf maps every address of a block back to its slot.
func TestPoolBlocks(t *testing.T) {
	cases := []struct {
		pool Pool
		slot Slot
		want string
	}{
		{Pool{V4: pfx("10.200.0.0/16")}, 1, "10.200.0.2/31 gw 10.200.0.2 sb 10.200.0.3"},
		{Pool{V4: pfx("10.200.0.0/16")}, 2, "10.200.0.4/31 gw 10.200.0.4 sb 10.200.0.5"},
		{Pool{V4: pfx("10.200.0.0/16")}, 200, "10.200.1.144/31 gw 10.200.1.144 sb 10.200.1.145"},
		{Pool{V4: pfx("10.200.0.0/16")}, 32767, "10.200.255.254/31 gw 10.200.255.254 sb 10.200.255.255"},
		{Pool{V4: pfx("10.200.0.0/16"), V4Bits: 30}, 1, "10.200.0.4/30 gw 10.200.0.5 sb 10.200.0.6"},
		{Pool{V4: pfx("10.200.0.0/16"), V6: pfx("fd00:c71d::/64")}, 1,
			"10.200.0.2/31 gw 10.200.0.2 sb 10.200.0.3; fd00:c71d::4/126 gw fd00:c71d::5 sb fd00:c71d::6"},
		{Pool{V4: pfx("10.200.0.0/16"), V6: pfx("fd00:c71d::/64"), V6Bits: 127}, 3,
			"10.200.0.6/31 gw 10.200.0.6 sb 10.200.0.7; fd00:c71d::6/127 gw fd00:c71d::6 sb fd00:c71d::7"},
		{Pool{V4: pfx("10.0.0.0/8"), V6: pfx("fd00:c71d::/64")}, 65536,
			"10.2.0.0/31 gw 10.2.0.0 sb 10.2.0.1; fd00:c71d::4:0/126 gw fd00:c71d::4:1 sb fd00:c71d::4:2"},
	}
	for _, c := range cases {
		b, err := c.pool.Block(c.slot)
		if err != nil {
			t.Fatalf("%v slot %d: %v", c.pool, c.slot, err)
		}
		got := fmt.Sprintf("%v gw %v sb %v", b.Net4, b.Gateway4, b.Addr4)
		if b.Net6.IsValid() {
			got += fmt.Sprintf("; %v gw %v sb %v", b.Net6, b.Gateway6, b.Addr6)
		}
		if got != c.want {
			t.Errorf("%v slot %d:\n got %s\nwant %s", c.pool, c.slot, got, c.want)
		}
		for _, a := range []netip.Addr{b.Gateway4, b.Addr4, lastAddr(b.Net4), b.Net4.Addr(), b.Gateway6, b.Addr6} {
			if !a.IsValid() {
				continue
			}
			if s, ok := c.pool.SlotOf(a); !ok || s != c.slot {
				t.Errorf("%v: SlotOf(%v) = %d, %v; want %d", c.pool, a, s, ok, c.slot)
			}
			if !b.Net4.Contains(a) && !b.Net6.Contains(a) {
				t.Errorf("%v is not in its block", a)
			}
		}
	}
	// A /16 of /31s is 32768 blocks; slot 0 is not handed out.
	if n := (Pool{V4: pfx("10.200.0.0/16")}).Len(); n != 32767 {
		t.Errorf("Len = %d, want 32767", n)
	}
	// With IPv6 the smaller family bounds the pool.
	if n := (Pool{V4: pfx("10.200.0.0/24"), V6: pfx("fd00::/64")}).Len(); n != 127 {
		t.Errorf("v4-bound Len = %d, want 127", n)
	}
	if n := (Pool{V4: pfx("10.0.0.0/8"), V6: pfx("fd00::/120")}).Len(); n != 63 {
		t.Errorf("v6-bound Len = %d, want 63", n)
	}
	if n := (Pool{V4: pfx("10.0.0.0/8"), V6: pfx("fd00::/64")}).Len(); n != MaxSlots-1 {
		t.Errorf("capped Len = %d, want %d", n, MaxSlots-1)
	}
}

// TestPoolSlotOfOutside: addresses that are no slot's.
func TestPoolSlotOfOutside(t *testing.T) {
	p := Pool{V4: pfx("10.200.0.0/24"), V6: pfx("fd00:c71d::/64")}
	for _, a := range []string{
		"10.200.0.0", "10.200.0.1", // slot 0
		"10.200.1.0", "10.199.255.255", "192.0.2.1", // outside
		"fd00:c71d::1", "fd00:c71d::3", // slot 0
		"fd00:c71d::200",                  // past Len (127 slots of v4 bound it)
		"fd00:c71d:0:1::5", "2001:db8::5", // outside
	} {
		if s, ok := p.SlotOf(ip(a)); ok {
			t.Errorf("SlotOf(%s) = %d, want none", a, s)
		}
	}
	if _, err := (Pool{V4: pfx("10.200.0.1/16")}).Block(1); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
		t.Errorf("Block of a bad pool: %v, want invalid_argument", err)
	}
	for _, s := range []Slot{0, 128} {
		if _, err := p.Block(s); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
			t.Errorf("Block(%d): %v, want invalid_argument", s, err)
		}
	}
}

// TestPoolAlloc: the lowest free slot; a full pool is capacity_exhausted;
// a slot comes back only when the caller drops it from the used set (its
// generation released with a proof), and a withheld one stays used.
func TestPoolAlloc(t *testing.T) {
	p := Pool{V4: pfx("10.200.0.0/29")} // 4 blocks: slots 1..3
	var used []Slot
	for want := Slot(1); want <= 3; want++ {
		s, err := p.Alloc(used)
		if err != nil || s != want {
			t.Fatalf("Alloc(%v) = %d, %v; want %d", used, s, err, want)
		}
		used = append(used, s)
	}
	_, err := p.Alloc(used)
	if errdefs.CodeOf(err) != errdefs.CodeCapacityExhausted || !strings.Contains(err.Error(), "10.200.0.0/29") {
		t.Fatalf("full pool: %v, want capacity_exhausted naming the pool", err)
	}
	// Slot 2's generation is released with a clean proof: only then is 2
	// free, and it is the one given out (lowest).
	released := []Slot{1, 3}
	if s, err := p.Alloc(released); err != nil || s != 2 {
		t.Fatalf("after release of 2: %d, %v", s, err)
	}
	// Duplicates and foreign values in the used set are harmless.
	if s, err := p.Alloc([]Slot{0, 1, 1, 99}); err != nil || s != 2 {
		t.Fatalf("Alloc with duplicates: %d, %v", s, err)
	}
	// Many allocations: all distinct, no block overlaps another.
	big := Pool{V4: pfx("10.200.0.0/22"), V6: pfx("fd00::/64")}
	used = nil
	seen := map[netip.Addr]Slot{}
	for i := 0; i < int(big.Len()); i++ {
		s, err := big.Alloc(used)
		if err != nil {
			t.Fatal(err)
		}
		used = append(used, s)
		b, _ := big.Block(s)
		for _, a := range []netip.Addr{b.Gateway4, b.Addr4, b.Gateway6, b.Addr6} {
			if other, dup := seen[a]; dup {
				t.Fatalf("%v of slot %d is slot %d's too", a, s, other)
			}
			seen[a] = s
		}
	}
	if _, err := big.Alloc(used); errdefs.CodeOf(err) != errdefs.CodeCapacityExhausted {
		t.Fatalf("after %d: %v", len(used), err)
	}
}

func TestAddrRanges(t *testing.T) {
	r := func(a, b string) AddrRange { return AddrRange{ip(a), ip(b)} }
	got := subtract([]AddrRange{rangeOf(pfx("10.0.0.0/8"))}, rangeOf(pfx("10.200.0.0/16")))
	if fmt.Sprint(got) != "[10.0.0.0-10.199.255.255 10.201.0.0-10.255.255.255]" {
		t.Errorf("subtract middle: %v", got)
	}
	if got := subtract([]AddrRange{r("10.0.0.0", "10.0.0.9")}, r("10.0.0.0", "10.0.0.9")); got != nil {
		t.Errorf("subtract all: %v", got)
	}
	if got := subtract([]AddrRange{r("10.0.0.0", "10.0.0.9")}, r("fd00::", "fd00::9")); len(got) != 1 {
		t.Errorf("subtract other family: %v", got)
	}
	got = union([]AddrRange{r("10.0.0.5", "10.0.0.9"), r("10.0.0.0", "10.0.0.4"), r("10.0.0.20", "10.0.0.30"), r("10.0.0.25", "10.0.0.26")})
	if fmt.Sprint(got) != "[10.0.0.0-10.0.0.9 10.0.0.20-10.0.0.30]" {
		t.Errorf("union: %v", got)
	}
	got = union([]AddrRange{rangeOf(pfx("::/0")), r("::1", "::2")})
	if fmt.Sprint(got) != "[::/0]" {
		t.Errorf("union at the top: %v", got)
	}
	for _, c := range []struct{ p, last string }{{"0.0.0.0/0", "255.255.255.255"}, {"10.1.2.3/24", "10.1.2.255"}, {"fd00::/7", "fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"}, {"1.2.3.4/32", "1.2.3.4"}} {
		if got := lastAddr(pfx(c.p)); got != ip(c.last) {
			t.Errorf("lastAddr(%s) = %v", c.p, got)
		}
	}
}
