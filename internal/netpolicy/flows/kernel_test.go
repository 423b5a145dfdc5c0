package flows

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"github.com/ti-mo/conntrack"
	vnl "github.com/vishvananda/netlink"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/netpolicy"
)

// table dumps every flow of the test netns as sorted "tuple mark" lines.
func table(t *testing.T, ns ktest.Netns) []string {
	t.Helper()
	c, err := conntrack.Dial(&netlink.Config{NetNS: int(ns.Handle)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fs, err := c.Dump(nil)
	if err != nil {
		t.Fatalf("dump conntrack: %v", err)
	}
	var out []string
	for _, f := range fs {
		out = append(out, fmt.Sprintf("%s mark %#x", tupleOf(f), f.Mark))
	}
	slices.Sort(out)
	return out
}

// The table's own flows, made with ctnetlink create in a netns of the
// test: slot 1's (one of them with bits outside the mask set, as other
// software on the node might), slot 2's and an unmarked one.
func TestKernelFlushCutCheckGone(t *testing.T) {
	ktest.Require(t)
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	ns := ktest.NewNetns(t)
	ctx := context.Background()
	c, err := conntrack.Dial(&netlink.Config{NetNS: int(ns.Handle)})
	if err != nil {
		t.Fatalf("dial conntrack (is nf_conntrack_netlink loaded?): %v", err)
	}
	defer c.Close()
	a := netip.MustParseAddr
	for _, f := range []conntrack.Flow{
		conntrack.NewFlow(protoTCP, 0, a(sb4), a("93.184.216.34"), 40001, 443, 300, 1),
		conntrack.NewFlow(protoTCP, 0, a(sb4), a("93.184.216.34"), 40002, 80, 300, 1),
		conntrack.NewFlow(protoUDP, 0, a(sb4), a("8.8.8.8"), 40003, 53, 300, 1),
		conntrack.NewFlow(protoTCP, 0, a(sb6), a("2001:db8:1::1"), 40004, 443, 300, 1),
		conntrack.NewFlow(protoTCP, 0, a(sb4), a("1.1.1.1"), 40005, 443, 300, 0x40000001),
		conntrack.NewFlow(protoTCP, 0, a("10.200.0.5"), a("1.1.1.1"), 40006, 80, 300, 2),
		conntrack.NewFlow(protoTCP, 0, a("10.9.9.9"), a("1.1.1.1"), 40007, 80, 300, 0),
	} {
		if err := c.Create(f); err != nil {
			t.Fatalf("create flow %s: %v", tupleOf(f), err)
		}
	}
	others := []string{
		"tcp 10.200.0.5:40006 -> 1.1.1.1:80 mark 0x2",
		"tcp 10.9.9.9:40007 -> 1.1.1.1:80 mark 0x0",
	}

	ct := &Conntrack{NetNS: int(ns.Handle)}
	ok, detail := ct.CheckGone(ctx, 1)
	if ok || !strings.HasPrefix(detail, "5 conntrack flows with mark 0x1/0xfffff remain: ") {
		t.Fatalf("CheckGone(1) before = %v, %q; want 5 flows listed", ok, detail)
	}

	eff := effective(t, true, netpolicy.Spec{Mode: "restricted", Rules: []netpolicy.RuleSpec{
		{CIDR: "93.184.216.0/24", Protocol: "tcp", Ports: []string{"443"}},
		{CIDR: "2001:db8:1::/48"},
	}})
	n, err := ct.Cut(ctx, 1, eff)
	if err != nil || n != 3 {
		t.Fatalf("Cut = %d, %v; want 3 cut", n, err)
	}
	want := append([]string{
		"tcp 10.200.0.3:40001 -> 93.184.216.34:443 mark 0x1",
		"tcp [fd00:c71d::6]:40004 -> [2001:db8:1::1]:443 mark 0x1",
	}, others...)
	slices.Sort(want)
	if got := table(t, ns); !slices.Equal(got, want) {
		t.Fatalf("after Cut the table is\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if n, err := ct.Cut(ctx, 1, eff); err != nil || n != 0 {
		t.Fatalf("second Cut = %d, %v; want 0 (nothing left to cut)", n, err)
	}

	if _, err := ct.Cut(ctx, 0, eff); !errdefs.Is(err, errdefs.CodeInvalidArgument) {
		t.Fatalf("Cut(slot 0) = %v, want invalid_argument", err)
	}
	if err := ct.Flush(ctx, 0); !errdefs.Is(err, errdefs.CodeInvalidArgument) {
		t.Fatalf("Flush(slot 0) = %v, want invalid_argument", err)
	}
	if err := ct.Flush(ctx, 1); err != nil {
		t.Fatalf("Flush(1): %v", err)
	}
	if ok, detail := ct.CheckGone(ctx, 1); !ok {
		t.Fatalf("CheckGone(1) after Flush = false: %s", detail)
	}
	if got := table(t, ns); !slices.Equal(got, others) {
		t.Fatalf("Flush(1) touched other flows: table is\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(others, "\n"))
	}
	if err := ct.Flush(ctx, 1); err != nil {
		t.Fatalf("Flush(1) again (nothing to delete): %v", err)
	}
	if err := ct.Flush(ctx, 2); err != nil {
		t.Fatalf("Flush(2): %v", err)
	}
	if ok, detail := ct.CheckGone(ctx, 2); !ok {
		t.Fatalf("CheckGone(2) after Flush = false: %s", detail)
	}
	if got := table(t, ns); !slices.Equal(got, others[1:]) {
		t.Fatalf("after Flush(2) the table is %q, want only the unmarked flow", got)
	}
}

// Real connections whose mark an nft rule sets, as the generation chain
// does: both ends in one netns of the test, over its loopback, from the
// sandbox's address to two destinations of which the new policy keeps one.
func TestKernelCutLiveConnections(t *testing.T) {
	ktest.Require(t)
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	ns := ktest.NewNetns(t)
	ctx := context.Background()

	nft, err := nftables.New(nftables.WithNetNSFd(int(ns.Handle)))
	if err != nil {
		t.Fatal(err)
	}
	tbl := nft.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "flowtest"})
	ch := nft.AddChain(&nftables.Chain{Name: "out", Table: tbl, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter})
	mark, err := Mark(DefaultMask, 1)
	if err != nil {
		t.Fatal(err)
	}
	nft.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: []expr.Any{ // ct mark set 1
		&expr.Immediate{Register: 1, Data: binaryutil.NativeEndian.PutUint32(mark)},
		&expr.Ct{Key: expr.CtKeyMARK, Register: 1, SourceRegister: true},
	}})
	if err := nft.Flush(); err != nil {
		t.Fatalf("add the test's nft rule: %v", err)
	}

	// Both addresses on the netns's lo: the connections stay in the netns.
	h, err := vnl.NewHandleAt(ns.Handle)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{sb4 + "/32", "93.184.216.34/32"} {
		addr, err := vnl.ParseAddr(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.AddrAdd(lo, addr); err != nil {
			t.Fatalf("add %s to lo: %v", p, err)
		}
	}

	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	err = ns.Do(func() error {
		for _, port := range []int{443, 80} {
			ln, err := net.Listen("tcp", fmt.Sprintf("93.184.216.34:%d", port))
			if err != nil {
				return err
			}
			defer ln.Close()
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(sb4)}, Timeout: 5 * time.Second}
			c, err := d.Dial("tcp", ln.Addr().String())
			if err != nil {
				return err
			}
			conns = append(conns, c)
			s, err := ln.Accept()
			if err != nil {
				return err
			}
			conns = append(conns, s)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	ct := &Conntrack{NetNS: int(ns.Handle)}
	ok, detail := ct.CheckGone(ctx, 1)
	if ok || !strings.HasPrefix(detail, "2 conntrack flows with mark 0x1/0xfffff remain: ") {
		t.Fatalf("CheckGone(1) with two open connections = %v, %q", ok, detail)
	}
	eff := effective(t, false, netpolicy.Spec{Mode: "restricted", Rules: []netpolicy.RuleSpec{
		{CIDR: "93.184.216.0/24", Protocol: "tcp", Ports: []string{"443"}},
	}})
	if n, err := ct.Cut(ctx, 1, eff); err != nil || n != 1 {
		t.Fatalf("Cut = %d, %v; want the port 80 connection cut", n, err)
	}
	ok, detail = ct.CheckGone(ctx, 1)
	if ok || !strings.Contains(detail, "1 conntrack flows") || !strings.Contains(detail, "93.184.216.34:443") {
		t.Fatalf("after Cut CheckGone(1) = %v, %q; want the port 443 connection kept", ok, detail)
	}
	if err := ct.Flush(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if ok, detail := ct.CheckGone(ctx, 1); !ok {
		t.Fatalf("CheckGone(1) after Flush: %s", detail)
	}
}
