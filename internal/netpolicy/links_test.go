package netpolicy

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/vishvananda/netlink"
)

// Bad input is refused before anything is touched: these run without
// root and without a netns, so reaching the kernel would fail differently.
func TestLinksRefuseBadInput(t *testing.T) {
	ctx := context.Background()
	l := &Links{ProcSys: t.TempDir()}
	good, err := Pool{V4: netip.MustParsePrefix("10.231.0.0/24")}.Block(1)
	if err != nil {
		t.Fatal(err)
	}
	good6, err := Pool{V4: netip.MustParsePrefix("10.231.0.0/24"), V6: netip.MustParsePrefix("fd00:1::/64")}.Block(1)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string]Block{
		"slot 0":             {Net4: good.Net4, Gateway4: good.Gateway4, Addr4: good.Addr4},
		"slot too big":       {Slot: MaxSlots, Net4: good.Net4, Gateway4: good.Gateway4, Addr4: good.Addr4},
		"no v4":              {Slot: 1},
		"gateway outside":    {Slot: 1, Net4: good.Net4, Gateway4: netip.MustParseAddr("10.9.9.9"), Addr4: good.Addr4},
		"gateway = address":  {Slot: 1, Net4: good.Net4, Gateway4: good.Addr4, Addr4: good.Addr4},
		"v6 address, no net": {Slot: 1, Net4: good.Net4, Gateway4: good.Gateway4, Addr4: good.Addr4, Addr6: good6.Addr6},
		"v6 address outside": {Slot: 1, Net4: good.Net4, Gateway4: good.Gateway4, Addr4: good.Addr4, Net6: good6.Net6, Gateway6: good6.Gateway6, Addr6: netip.MustParseAddr("fd00:2::2")},
		"v4 net given as v6": {Slot: 1, Net4: good6.Net6, Gateway4: good6.Gateway6, Addr4: good6.Addr6},
	} {
		err := l.Make(ctx, Owner{ID: "sb", Generation: 1, Block: b}, "/run/netns/x")
		if !errdefs.Is(err, errdefs.CodeInvalidArgument) {
			t.Errorf("Make with %s: %v, want invalid_argument", name, err)
		}
	}
	if err := l.Make(ctx, Owner{ID: "sb", Generation: 1, Block: good}, "run/netns/x"); !errdefs.Is(err, errdefs.CodeInvalidArgument) {
		t.Errorf("Make with a relative netns path: %v, want invalid_argument", err)
	}
	for _, name := range []string{"eth0", "ctl-", "ctl-00000", "ctl-0000A", "ctl-000001", "lo"} {
		if err := l.Remove(ctx, name); !errdefs.Is(err, errdefs.CodeInvalidArgument) {
			t.Errorf("Remove(%q): %v, want invalid_argument", name, err)
		}
	}
}

func TestLinksEnableForwarding(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	l := &Links{ProcSys: dir}
	files := map[string]string{"net/ipv4/ip_forward": "0\n", "net/ipv6/conf/all/forwarding": "0\n"}
	for f, v := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	read := func(f string) string {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if err := l.EnableForwarding(ctx, false); err != nil {
		t.Fatal(err)
	}
	if a, b := read("net/ipv4/ip_forward"), read("net/ipv6/conf/all/forwarding"); a != "1" || b != "0\n" {
		t.Errorf("v4 only: ip_forward %q, v6 forwarding %q", a, b)
	}
	// Idempotent, and writes only what differs: a sysctl that already
	// holds 1 is not written again (its mtime stays).
	p4 := filepath.Join(dir, "net/ipv4/ip_forward")
	old := time.Unix(1, 0)
	if err := os.Chtimes(p4, old, old); err != nil {
		t.Fatal(err)
	}
	if err := l.EnableForwarding(ctx, true); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(p4); err != nil || !fi.ModTime().Equal(old) {
		t.Errorf("ip_forward written again although it held 1 (%v, %v)", fi.ModTime(), err)
	}
	if b := read("net/ipv6/conf/all/forwarding"); b != "1" {
		t.Errorf("v6 forwarding %q", b)
	}
	if err := (&Links{ProcSys: filepath.Join(dir, "missing")}).EnableForwarding(ctx, false); err == nil {
		t.Error("EnableForwarding without the sysctl files: no error")
	}
}

// TestRetryDump: a dump the kernel flags as interrupted (possibly
// incomplete) is run again, never returned; one interrupted every time
// is an error.
func TestRetryDump(t *testing.T) {
	calls := 0
	got, err := retryDump(func() ([]int, error) {
		if calls++; calls < 3 {
			return []int{1}, netlink.ErrDumpInterrupted
		}
		return []int{1, 2}, nil
	})
	if err != nil || len(got) != 2 || calls != 3 {
		t.Fatalf("retryDump = %v, %v after %d calls; want [1 2], nil after 3", got, err, calls)
	}
	calls = 0
	got, err = retryDump(func() ([]int, error) { calls++; return []int{1}, netlink.ErrDumpInterrupted })
	if !errors.Is(err, netlink.ErrDumpInterrupted) || got != nil || calls != dumpTries {
		t.Fatalf("always interrupted: %v, %v after %d calls; want nil, ErrDumpInterrupted after %d", got, err, calls, dumpTries)
	}
}
