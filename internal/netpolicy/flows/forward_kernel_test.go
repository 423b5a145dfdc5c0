package flows

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	vnl "github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/netpolicy"
)

// The node's topology in three netns of the test: a guest (10.200.0.3,
// slot 1 of the pool) behind the link "ctl-t" of a router, whose forward
// chain has the shape of ctld's (established first, then the slot's mark
// and its allow rules, then drop), and a server (192.0.2.10) behind it.
const (
	fwdLink  = "ctl-t"
	serverIP = "192.0.2.10"
)

func ifname(n string) []byte {
	b := make([]byte, 16)
	copy(b, n)
	return b
}

// forwardRules is the router's forward chain allowing the guest tcp to the
// server on ports.
func forwardRules(ports ...uint16) [][]expr.Any {
	fromGuest := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(fwdLink)},
	}
	rules := [][]expr.Any{
		{ // ct state established,related accept
			&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
				Xor:  binaryutil.NativeEndian.PutUint32(0)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
			&expr.Verdict{Kind: expr.VerdictAccept},
		},
		append(fromGuest[:2:2], // ct mark set <slot 1>
			&expr.Immediate{Register: 1, Data: binaryutil.NativeEndian.PutUint32(1)},
			&expr.Ct{Key: expr.CtKeyMARK, Register: 1, SourceRegister: true}),
	}
	for _, p := range ports { // ip daddr server tcp dport p accept
		rules = append(rules, append(fromGuest[:2:2],
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: net.ParseIP(serverIP).To4()},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(p)},
			&expr.Verdict{Kind: expr.VerdictAccept}))
	}
	return append(rules, append(fromGuest[:2:2], &expr.Verdict{Kind: expr.VerdictDrop}))
}

// setForward replaces the router's forward rules in one transaction, as
// a live update does.
func setForward(t *testing.T, c *nftables.Conn, ch *nftables.Chain, ports ...uint16) {
	t.Helper()
	c.FlushChain(ch)
	for _, ex := range forwardRules(ports...) {
		c.AddRule(&nftables.Rule{Table: ch.Table, Chain: ch, Exprs: ex})
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("set the router's forward rules (ports %v): %v", ports, err)
	}
}

func route(t *testing.T, ns ktest.Netns, dst, gw string) {
	t.Helper()
	h, err := vnl.NewHandleAt(ns.Handle)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	r := &vnl.Route{Gw: net.ParseIP(gw)}
	if dst != "" {
		_, r.Dst, _ = net.ParseCIDR(dst)
	}
	if err := h.RouteAdd(r); err != nil {
		t.Fatalf("route %s via %s: %v", dst, gw, err)
	}
}

// echo sends a line on c and waits for it back.
func echo(c net.Conn, r *bufio.Reader, line string) error {
	if err := c.SetDeadline(time.Now().Add(1500 * time.Millisecond)); err != nil {
		return err
	}
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return err
	}
	got, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if got != line+"\n" {
		return fmt.Errorf("echo %q came back as %q", line, got)
	}
	return nil
}

// A live update with connections open through a router: after the new
// rules alone the removed destination still works (established is
// accepted before any rule); after Cut it does not, and the kept one
// does.
func TestKernelCutThroughForward(t *testing.T) {
	ktest.Require(t)
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	ctx := context.Background()
	router, guest, server := ktest.NewNetns(t), ktest.NewNetns(t), ktest.NewNetns(t)
	ktest.VethPair(t, ktest.Veth{Netns: router.Handle, Name: fwdLink, Addr: "10.200.0.2/31"}, ktest.Veth{Netns: guest.Handle, Name: "eth0", Addr: "10.200.0.3/31"})
	ktest.VethPair(t, ktest.Veth{Netns: router.Handle, Name: "up0", Addr: "192.0.2.1/24"}, ktest.Veth{Netns: server.Handle, Name: "eth0", Addr: serverIP + "/24"})
	route(t, guest, "", "10.200.0.2")
	route(t, server, "10.200.0.0/16", "192.0.2.1")
	if err := router.Do(func() error { return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0) }); err != nil {
		t.Fatalf("turn on forwarding in the router: %v", err)
	}

	nft, err := nftables.New(nftables.WithNetNSFd(int(router.Handle)))
	if err != nil {
		t.Fatal(err)
	}
	tbl := nft.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "ctld"})
	accept := nftables.ChainPolicyAccept
	ch := nft.AddChain(&nftables.Chain{Name: "forward", Table: tbl, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	setForward(t, nft, ch, 443, 80)

	// Echo servers on the server. Their connections are closed by the
	// test: the cut one never hears from its client again.
	for _, port := range []int{443, 80} {
		var ln net.Listener
		if err := server.Do(func() (err error) {
			ln, err = net.Listen("tcp", fmt.Sprintf("%s:%d", serverIP, port))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		ktest.EchoTCP(t, ln)
	}
	type conn struct {
		net.Conn
		r *bufio.Reader
	}
	dial := func(port int) (conn, error) {
		var c net.Conn
		err := guest.Do(func() (err error) {
			c, err = net.DialTimeout("tcp", fmt.Sprintf("%s:%d", serverIP, port), 2*time.Second)
			return err
		})
		if err != nil {
			return conn{}, err
		}
		t.Cleanup(func() { c.Close() })
		return conn{c, bufio.NewReader(c)}, nil
	}
	kept, cut := mustDial(t, dial, 443), mustDial(t, dial, 80)
	for name, c := range map[string]conn{"443": kept, "80": cut} {
		if err := echo(c, c.r, "before "+name); err != nil {
			t.Fatalf("port %s before the update: %v", name, err)
		}
	}

	ct := &Conntrack{NetNS: int(router.Handle)}
	if ok, detail := ct.CheckGone(ctx, 1); ok || !strings.HasPrefix(detail, "2 conntrack flows") {
		t.Fatalf("the router's conntrack before the update: %v %q; want the two marked flows", ok, detail)
	}

	setForward(t, nft, ch, 443) // the new policy: port 80 no longer allowed
	if _, err := dial(80); err == nil {
		t.Fatal("a new connection to port 80 passed the new rules")
	}
	if err := echo(cut, cut.r, "after the rules"); err != nil {
		t.Fatalf("port 80 after the new rules, before Cut: %v (established should still carry it: without Cut a removed destination stays reachable)", err)
	}

	eff := effective(t, false, netpolicy.Spec{Mode: "restricted", Rules: []netpolicy.RuleSpec{
		{CIDR: serverIP + "/32", Protocol: "tcp", Ports: []string{"443"}},
	}})
	if n, err := ct.Cut(ctx, 1, eff); err != nil || n != 1 {
		t.Fatalf("Cut = %d, %v; want the port 80 flow cut", n, err)
	}
	if err := echo(kept, kept.r, "after cut"); err != nil {
		t.Errorf("port 443 after Cut: %v; want it kept", err)
	}
	var ne net.Error
	if err := echo(cut, cut.r, "after cut"); err == nil {
		t.Errorf("port 80 still echoes after Cut")
	} else if !errors.As(err, &ne) || !ne.Timeout() {
		t.Logf("port 80 after Cut: %v", err)
	}

	if err := ct.Flush(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if ok, detail := ct.CheckGone(ctx, 1); !ok {
		t.Fatalf("CheckGone after Flush: %s", detail)
	}
}

func mustDial[C any](t *testing.T, dial func(int) (C, error), port int) C {
	t.Helper()
	c, err := dial(port)
	if err != nil {
		t.Fatalf("dial port %d through the router: %v", port, err)
	}
	return c
}
