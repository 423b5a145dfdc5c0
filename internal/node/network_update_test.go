package node

import (
	"context"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/netpolicy"
	"github.com/ctld/ctld/internal/node/fakekernel"
)

var (
	flowAllowed = fakekernel.Flow{Proto: netpolicy.ProtoTCP, Dst: netip.MustParseAddrPort("203.0.113.7:443")}
	flowCut     = fakekernel.Flow{Proto: netpolicy.ProtoTCP, Dst: netip.MustParseAddrPort("198.51.100.1:443")}
)

// TestUpdateNetworkInPlace: a live update changes the running
// generation's chain in one apply, cuts the flows the new policy no
// longer allows and keeps the others, tells the DNS proxy, journals the
// policy in force, and leaves the guest as it was; the same policy again
// makes no kernel call.
func TestUpdateNetworkInPlace(t *testing.T) {
	tk, k := fakeKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	req := claimReq("c1", 1)
	req.Network = journal.NetworkPolicy{Mode: "open"}
	r.mustClaim(sb, req)
	k.AddFlow(1, flowAllowed)
	k.AddFlow(1, flowCut)
	k.Calls()
	ctx := context.Background()
	got, err := r.n.UpdateNetwork(ctx, sb, updatePolicy)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != journal.StateReady || got.Network == nil || got.Network.Mode != "restricted" {
		t.Fatalf("update answered %+v (network %+v)", got, got.Network)
	}
	calls := k.Calls()
	if want := []string{"nft apply sb-sb-g1 restricted", "conntrack cut 1: 1"}; !slices.Equal(calls, want) {
		t.Errorf("update calls %q, want %q (no guest or link touched)", calls, want)
	}
	if fs := k.FlowsOf(1); !slices.Equal(fs, []fakekernel.Flow{flowAllowed}) {
		t.Errorf("flows after the update: %v, want only %v", fs, flowAllowed)
	}
	if eff, ok := k.Registered(1); !ok || eff.Mode != netpolicy.ModeRestricted {
		t.Errorf("DNS proxy holds %v %+v, want restricted", ok, eff)
	}
	s := r.sandbox(sb)
	if s.NetworkUpdate != nil || s.Network == nil || !reflect.DeepEqual(*s.Network, updatePolicy) {
		t.Errorf("journal after the update: network %+v, update %+v", s.Network, s.NetworkUpdate)
	}
	if _, err := r.n.UpdateNetwork(ctx, sb, updatePolicy); err != nil {
		t.Fatal(err)
	}
	if calls := k.Calls(); len(calls) > 0 {
		t.Errorf("the same policy again called %q", calls)
	}
	// A takeover keeps the updated policy (the DNS proxy learns it again).
	r.mustBoot()
	if eff, ok := k.Registered(1); !ok || eff.Mode != netpolicy.ModeRestricted {
		t.Errorf("after the takeover the DNS proxy holds %v %+v, want restricted", ok, eff)
	}
	r.mustRelease(sb, "r1", 1)
	r.checkClean("after the release")
}

// TestUpdateNetworkApplyFails: an update the firewall refuses leaves the
// old policy in the kernel and in the journal, and says so.
func TestUpdateNetworkApplyFails(t *testing.T) {
	tk, k := fakeKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	r.mustClaim(sb, claimReq("c1", 1))
	k.AddFlow(1, flowCut)
	before := r.sandbox(sb)
	k.FailMake(journal.KindNft, "sb-g1", nil)
	_, err := r.n.UpdateNetwork(context.Background(), sb, updatePolicy)
	if errdefs.CodeOf(err) != errdefs.CodeUnavailable || !strings.Contains(err.Error(), "old policy holds") {
		t.Fatalf("update with the firewall failing: %v", err)
	}
	if after := r.sandbox(sb); !reflect.DeepEqual(after, before) {
		t.Errorf("a failed update changed the record:\n%+v\nwas\n%+v", after, before)
	}
	if eff, _ := k.Effective("sb-sb-g1"); eff.Mode != netpolicy.ModeDenyAll {
		t.Errorf("the kernel enforces %s, want deny_all still", eff.Mode)
	}
	if len(k.FlowsOf(1)) != 1 {
		t.Error("a failed update cut flows")
	}
}

// TestUpdateNetworkRefusals: a node without the subsystems a mode needs
// refuses the update (fail closed) and changes nothing; only a ready
// generation can be updated.
func TestUpdateNetworkRefusals(t *testing.T) {
	tk, k := fakeKernel(t)
	tk.firewall = nil
	r := newRig(t, tk)
	r.mustBoot()
	r.mustClaim(sb, claimReq("c1", 1))
	before := r.sandbox(sb)
	k.Calls()
	ctx := context.Background()
	if _, err := r.n.UpdateNetwork(ctx, sb, updatePolicy); errdefs.CodeOf(err) != errdefs.CodeUnavailable {
		t.Errorf("update without a firewall: %v, want unavailable", err)
	}
	if got, err := r.n.UpdateNetwork(ctx, sb, journal.NetworkPolicy{Mode: "deny_all"}); err != nil || got.State != journal.StateReady {
		t.Errorf("update to the policy in force: %+v, %v", got, err)
	}
	if calls := k.Calls(); len(calls) > 0 {
		t.Errorf("refused updates called the kernel: %q", calls)
	}
	if after := r.sandbox(sb); !reflect.DeepEqual(after, before) {
		t.Errorf("refused updates changed the record")
	}
	bad := journal.NetworkPolicy{Mode: "deny_all", Rules: []journal.NetworkRule{{CIDR: "10.0.0.0/8"}}}
	if _, err := r.n.UpdateNetwork(ctx, sb, bad); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
		t.Errorf("invalid policy: %v, want invalid_argument", err)
	}
	r.mustRelease(sb, "r1", 1)
	if _, err := r.n.UpdateNetwork(ctx, sb, journal.NetworkPolicy{}); errdefs.CodeOf(err) != errdefs.CodeConflict {
		t.Errorf("update of a released generation: %v, want conflict", err)
	}
}

// TestGetShowsNetworkCounters: a ready generation's view carries its
// mode and its chain's counters.
func TestGetShowsNetworkCounters(t *testing.T) {
	tk, k := fakeKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	r.mustClaim(sb, claimReq("c1", 1))
	k.SetCounters("sb-sb-g1", netpolicy.Counters{TxBytes: 1500, TxPackets: 3, DroppedPackets: 7})
	got, err := r.n.Get(context.Background(), sb)
	want := NetworkStatus{Mode: "deny_all", Counters: netpolicy.Counters{TxBytes: 1500, TxPackets: 3, DroppedPackets: 7}}
	if err != nil || got.Network == nil || *got.Network != want {
		t.Fatalf("get: %+v, %v; want network %+v", got.Network, err, want)
	}
	if s := r.sandbox(sb); s.State != journal.StateReady {
		t.Fatal(s.State)
	}
}

// TestReleaseWaitsForUpdate: a release that arrives while a live update
// of the same generation is between its journal and the firewall waits
// for it, so the update never makes nft objects after the teardown
// removed them.
func TestReleaseWaitsForUpdate(t *testing.T) {
	tk, _ := fakeKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	r.mustClaim(sb, claimReq("c1", 1))
	held, resume := make(chan struct{}), make(chan struct{})
	r.pause = func(point string) {
		if point == "netupdate:intended" {
			close(held)
			<-resume
		}
	}
	updated := make(chan error, 1)
	go func() {
		_, err := r.n.UpdateNetwork(context.Background(), sb, updatePolicy)
		updated <- err
	}()
	<-held
	released := make(chan error, 1)
	go func() {
		_, err := r.n.Release(context.Background(), sb, ReleaseRequest{OperationID: "r1", Generation: 1})
		released <- err
	}()
	select {
	case err := <-released:
		t.Fatalf("release finished while an update was in flight: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(resume)
	if err := <-updated; err != nil {
		t.Fatalf("update: %v", err)
	}
	if err := <-released; err != nil {
		t.Fatalf("release: %v", err)
	}
	r.pause = nil
	r.checkProof("r1")
	r.checkClean("after the update and the release")
}

// TestUpdateRemovingADomainName: a live update that removes one of two
// names sharing a port profile (one domain set) takes the removed name's
// resolved addresses out of the set at the update and cuts its flows,
// also an answer the DNS proxy gives for it while the update is between
// its nft apply and its end: the proxy answers by the new policy before
// nft applies it.
func TestUpdateRemovingADomainName(t *testing.T) {
	tk, k := fakeKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	rule := func(name string) journal.NetworkRule {
		return journal.NetworkRule{Domain: name, Protocol: "tcp", Ports: []string{"443"}}
	}
	req := claimReq("c1", 1)
	req.Network = journal.NetworkPolicy{Mode: "restricted", Rules: []journal.NetworkRule{rule("a.example"), rule("b.example")}}
	r.mustClaim(sb, req)
	slot := netpolicy.Slot(r.sandbox(sb).Slot)
	ctx := t.Context()
	a, late := netip.MustParseAddr("203.0.113.7"), netip.MustParseAddr("203.0.113.9")
	if ok, err := k.DNSProxy().Answer(ctx, slot, "a.example", []netip.Addr{a}, time.Minute); !ok || err != nil {
		t.Fatalf("answer of a.example before the update: %v %v", ok, err)
	}
	k.AddFlow(slot, fakekernel.Flow{Proto: netpolicy.ProtoTCP, Dst: netip.AddrPortFrom(a, 443)})
	if !strings.Contains(k.String(), "element "+a.String()) {
		t.Fatalf("a.example's answer is not in its set:\n%s", k.String())
	}
	var once sync.Once
	r.pause = func(point string) {
		if point == "netupdate:applied" {
			once.Do(func() {
				// The guest asks for the removed name right after the
				// apply: the proxy must not let it in any more.
				if ok, err := k.DNSProxy().Answer(ctx, slot, "a.example", []netip.Addr{late}, time.Minute); ok || err != nil {
					t.Errorf("the proxy answered a.example by the old policy after the apply (ok %v, err %v)", ok, err)
				}
			})
		}
	}
	defer func() { r.pause = nil }()
	if _, err := r.n.UpdateNetwork(ctx, sb, journal.NetworkPolicy{Mode: "restricted", Rules: []journal.NetworkRule{rule("b.example")}}); err != nil {
		t.Fatal(err)
	}
	for _, addr := range []netip.Addr{a, late} {
		if strings.Contains(k.String(), "element "+addr.String()) {
			t.Errorf("address %v of the removed name is still in a domain set after the update:\n%s", addr, k.String())
		}
	}
	if fl := k.FlowsOf(slot); slices.ContainsFunc(fl, func(f fakekernel.Flow) bool { return f.Dst.Addr() == a }) {
		t.Errorf("the flow to the removed name's address was not cut: %v", fl)
	}
	if ok, err := k.DNSProxy().Answer(ctx, slot, "b.example", []netip.Addr{netip.MustParseAddr("203.0.113.8")}, time.Minute); !ok || err != nil {
		t.Errorf("b.example (kept) after the update: %v %v", ok, err)
	}
}
