package netpolicy

import (
	"bytes"
	"testing"
)

func TestLinkName(t *testing.T) {
	for _, c := range []struct {
		slot Slot
		name string
	}{{1, "ctl-00001"}, {0x1a, "ctl-0001a"}, {MaxSlots - 1, "ctl-fffff"}} {
		if got := LinkName(c.slot); got != c.name {
			t.Errorf("LinkName(%d) = %q, want %q", c.slot, got, c.name)
		}
		if len(c.name) > 15 {
			t.Errorf("%q is longer than a link name may be", c.name)
		}
		if s, ok := ParseLinkName(c.name); !ok || s != c.slot {
			t.Errorf("ParseLinkName(%q) = %d, %v", c.name, s, ok)
		}
	}
	for _, bad := range []string{"ctl-00000", "ctl-1a", "ctl-0001A", "ctl-100000", "eth0", "ctl-0001g", "ctl--0001", "xctl-00001"} {
		if s, ok := ParseLinkName(bad); ok {
			t.Errorf("ParseLinkName(%q) = %d, want not a sandbox link", bad, s)
		}
	}
}

func TestChainNames(t *testing.T) {
	if got := ChainName("web-1", 3); got != "sb-web-1-g3" {
		t.Errorf("ChainName = %q", got)
	}
	if got := SetName("web-1", 3, "a4"); got != "sb-web-1-g3.a4" {
		t.Errorf("SetName = %q", got)
	}
	// A sandbox whose id looks like a generation name with a suffix is
	// still read one way only.
	for _, c := range []struct {
		name string
		id   string
		gen  uint64
	}{
		{"sb-web-1-g3", "web-1", 3},
		{"sb-web-1-g3.a4", "web-1", 3},
		{"sb-a-g1-g2", "a-g1", 2},
		{"sb-a-g1-g2.d0-4", "a-g1", 2},
		{SetName("a-g1", 2, "tx"), "a-g1", 2},
	} {
		id, gen, ok := ParseChainName(c.name)
		if !ok || id != c.id || gen != c.gen {
			t.Errorf("ParseChainName(%q) = %q, %d, %v; want %q, %d", c.name, id, gen, ok, c.id, c.gen)
		}
	}
	for _, bad := range []string{"web-1-g3", "sb-web-1", "sb-web-1-g0", "sb-web-1-g03", "sb-.a4", "sb-Web-g1", "forward", "sb-web-1-g3-a4"} {
		if _, _, ok := ParseChainName(bad); ok {
			t.Errorf("ParseChainName(%q) accepted", bad)
		}
	}
}

// TestElementKey: the bytes of a concatenated interval element, and back.
func TestElementKey(t *testing.T) {
	e := Element{AddrRange{ip("203.0.113.0"), ip("203.0.113.127")}, ProtoTCP, PortRange{443, 8443}}
	wantKey := []byte{203, 0, 113, 0, 6, 0, 0, 0, 0x01, 0xbb, 0, 0}
	wantEnd := []byte{203, 0, 113, 127, 6, 0, 0, 0, 0x20, 0xfb, 0, 0}
	if !bytes.Equal(e.Key(), wantKey) || !bytes.Equal(e.KeyEnd(), wantEnd) {
		t.Errorf("key %x end %x, want %x %x", e.Key(), e.KeyEnd(), wantKey, wantEnd)
	}
	e6 := Element{AddrRange{ip("2001:db8::"), ip("2001:db8::ffff")}, ProtoUDP, PortRange{53, 53}}
	if k := e6.Key(); len(k) != 24 || k[16] != 17 || k[20] != 0 || k[21] != 53 {
		t.Errorf("v6 key %x", k)
	}
	for _, el := range []Element{e, e6} {
		got, err := ParseElement(el.Key(), el.KeyEnd())
		if err != nil || got != el {
			t.Errorf("ParseElement(%v) = %v, %v", el, got, err)
		}
	}
	if _, err := ParseElement(e.Key(), e6.KeyEnd()); err == nil {
		t.Error("mixed families accepted")
	}
	if _, err := ParseElement(e.KeyEnd(), e.Key()); err == nil {
		t.Error("end before start accepted")
	}
	if _, err := ParseElement([]byte{1, 2, 3}, nil); err == nil {
		t.Error("short key accepted")
	}
	// Every element of a resolved policy survives the round trip.
	f := testFacts(t, true)
	r := Resolve(mustParse(t, Spec{Mode: "open", Rules: []RuleSpec{{CIDR: "10.1.0.0/16", Protocol: "tcp", Ports: []string{"5432"}}}}), f)
	for _, el := range append(r.Allow4, r.Allow6...) {
		if got, err := ParseElement(el.Key(), el.KeyEnd()); err != nil || got != el {
			t.Fatalf("round trip of %v: %v, %v", el, got, err)
		}
	}
}
