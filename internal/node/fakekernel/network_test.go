package fakekernel

import (
	"context"
	"errors"
	"io/fs"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/netpolicy"
)

func owner(t *testing.T) netpolicy.Owner {
	t.Helper()
	pool := netpolicy.Pool{V4: netip.MustParsePrefix("10.200.0.0/24")}
	b, err := pool.Block(1)
	if err != nil {
		t.Fatal(err)
	}
	return netpolicy.Owner{ID: "sb", Generation: 1, Block: b}
}

// TestNetworkObjects: the network's objects render as text, their
// removals are idempotent, CheckGone sees each, and a netns that dies
// takes its veth with it.
func TestNetworkObjects(t *testing.T) {
	k := newKernel(t)
	ctx := context.Background()
	o := owner(t)
	ns, err := k.Netns().Create(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Links().Make(ctx, o, "/nonexistent"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("link into a missing netns: %v", err)
	}
	if err := k.Firewall().Apply(ctx, o, netpolicy.Effective{Mode: netpolicy.ModeDenyAll}); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("apply before Ensure: %v, want the table missing", err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(k.Firewall().Ensure(ctx))
	must(k.Links().Make(ctx, o, ns))
	must(k.Links().Make(ctx, o, ns)) // the same pair again
	eff := netpolicy.Effective{Mode: netpolicy.ModeRestricted, Domains: []netpolicy.DomainSet{{Names: []string{"example.com"}, Proto: netpolicy.ProtoTCP, Ports: []netpolicy.PortRange{{From: 443, To: 443}}}}}
	must(k.Firewall().Apply(ctx, o, eff))
	must(k.Firewall().AllowResolved(ctx, o, 0, []netip.Addr{netip.MustParseAddr("203.0.113.7")}, time.Minute))
	k.DNSProxy().Register(o, eff)
	k.AddFlow(1, Flow{Proto: netpolicy.ProtoTCP, Dst: netip.MustParseAddrPort("203.0.113.7:443")})
	k.AddFlow(1, Flow{Proto: netpolicy.ProtoTCP, Dst: netip.MustParseAddrPort("203.0.113.8:443")})
	want := strings.Join([]string{
		"conntrack mark 1 tcp 203.0.113.7:443",
		"conntrack mark 1 tcp 203.0.113.8:443",
		"dns slot 1 sb-g1 mode restricted",
		"link ctl-00001 alias sb-g1 peer eth0 in net:[4026532100] gateway 10.200.0.2 sandbox 10.200.0.3",
		"netns sb-g1 net:[4026532100]",
		"nft chain sb-sb-g1 domain set 0 element 203.0.113.7 timeout 1m0s",
		"nft chain sb-sb-g1 mode restricted allow4 0 allow6 0 domains 1",
		"nft dispatch ctl-00001 goto sb-sb-g1",
	}, "\n")
	if got := k.String(); got != want {
		t.Fatalf("state:\n%s\nwant:\n%s", got, want)
	}
	// Cut keeps the flow the policy's allow set allows, cuts the other: a
	// domain set's answer is no reason to keep a flow (conntrack cannot
	// tell which name an address was answered for; nettest's cut case).
	allow := eff
	allow.Source4 = o.Block.Addr4
	a7 := netip.MustParseAddr("203.0.113.7")
	allow.Allow4 = []netpolicy.Element{{Dst: netpolicy.AddrRange{From: a7, To: a7}, Proto: netpolicy.ProtoTCP, Ports: netpolicy.PortRange{From: 443, To: 443}}}
	if n, err := k.Flows().Cut(ctx, 1, allow); err != nil || n != 1 {
		t.Fatalf("cut: %d, %v; want 1", n, err)
	}
	if fs := k.FlowsOf(1); len(fs) != 1 || fs[0].Dst.Addr() != netip.MustParseAddr("203.0.113.7") {
		t.Fatalf("flows after the cut: %v", fs)
	}
	for what, gone := range map[string]func() (bool, string){
		"links":     func() (bool, string) { return k.Links().CheckGone(ctx, o) },
		"nft":       func() (bool, string) { return k.Firewall().CheckGone(ctx, o) },
		"conntrack": func() (bool, string) { return k.Flows().CheckGone(ctx, 1) },
	} {
		if ok, d := gone(); ok {
			t.Errorf("%s gone while it exists: %s", what, d)
		}
	}
	k.DNSProxy().Unregister(1)
	must(k.Firewall().Remove(ctx, o))
	must(k.Firewall().Remove(ctx, o))
	must(k.Flows().Flush(ctx, 1))
	must(k.Netns().Delete(ctx, id)) // the netns dies and takes the pair
	for what, gone := range map[string]func() (bool, string){
		"links":     func() (bool, string) { return k.Links().CheckGone(ctx, o) },
		"nft":       func() (bool, string) { return k.Firewall().CheckGone(ctx, o) },
		"conntrack": func() (bool, string) { return k.Flows().CheckGone(ctx, 1) },
	} {
		if ok, d := gone(); !ok {
			t.Errorf("%s not gone: %s", what, d)
		}
	}
	must(k.Links().Remove(ctx, o.Link()))
	if got := k.String(); got != "" {
		t.Fatalf("after teardown:\n%s", got)
	}
}

// TestFirewallListsDanglingDispatch: a dispatch element whose chain is
// gone still names its generation, and RemoveOrphan takes it.
func TestFirewallListsDanglingDispatch(t *testing.T) {
	k := newKernel(t)
	ctx := context.Background()
	o := owner(t)
	if err := k.Firewall().Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if err := k.Firewall().Apply(ctx, o, netpolicy.Effective{Mode: netpolicy.ModeDenyAll}); err != nil {
		t.Fatal(err)
	}
	k.mu.Lock()
	delete(k.chains, o.Chain())
	k.mu.Unlock()
	if got, _ := k.Firewall().List(ctx); len(got) != 1 || got[0] != o.Chain() {
		t.Fatalf("list: %v, want [%s]", got, o.Chain())
	}
	if err := k.Firewall().RemoveOrphan(ctx, o.Chain()); err != nil {
		t.Fatal(err)
	}
	if got := k.String(); got != "" {
		t.Fatalf("after RemoveOrphan:\n%s", got)
	}
}
