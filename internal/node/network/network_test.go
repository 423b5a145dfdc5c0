package network

import (
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/netpolicy"
	"github.com/ctld/ctld/internal/node/fakekernel"
	"github.com/ctld/ctld/internal/node/op"
	"github.com/ctld/ctld/internal/node/resource"
)

// The package's own tests: a Net over the fake kernel and a real journal,
// without the node. The node's tests (internal/node) run it inside whole
// claims, releases and takeovers.

var (
	testPool  = netpolicy.Pool{V4: netip.MustParsePrefix("10.200.0.0/28"), V6: netip.MustParsePrefix("fd00:c71d::/120")}
	openPol   = journal.NetworkPolicy{Mode: "open"}
	restrict  = journal.NetworkPolicy{Mode: "restricted", Rules: []journal.NetworkRule{{CIDR: "203.0.113.0/24", Protocol: "tcp", Ports: []string{"443"}}}}
	denyAll   = journal.NetworkPolicy{Mode: "deny_all"}
	allowed   = fakekernel.Flow{Proto: netpolicy.ProtoTCP, Dst: netip.MustParseAddrPort("203.0.113.7:443")}
	notAllow  = fakekernel.Flow{Proto: netpolicy.ProtoTCP, Dst: netip.MustParseAddrPort("198.51.100.1:443")}
	everyPart = func(d *Wiring, k *fakekernel.Kernel) {
		d.Links, d.Firewall, d.Flows, d.DNSProxy = k.Links(), k.Firewall(), k.Flows(), k.DNSProxy()
	}
)

type testNet struct {
	*Net
	k *fakekernel.Kernel
	j *journal.Journal
}

// newTestNet is a Net over a new fake kernel with a netns and an address
// pool; with adds the rest of its subsystems.
func newTestNet(t *testing.T, carriers int, with ...func(*Wiring, *fakekernel.Kernel)) testNet {
	t.Helper()
	j, err := journal.Open(filepath.Join(t.TempDir(), "journal.db"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	if err := j.TakeOver(1); err != nil {
		t.Fatal(err)
	}
	k, err := fakekernel.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	term := op.NewTerm(context.Background())
	d := Wiring{
		Deps: Deps{Netns: k.Netns(), Pool: testPool},
		Term: term, Run: &op.Runner{J: j, Epoch: 1, Term: term}, Locks: &op.Locks{}, Carriers: carriers, CarrierWait: time.Second,
	}
	for _, f := range with {
		f(&d, k)
	}
	tn := testNet{k: k, j: j}
	d.Identities = netnsIdentities{&tn}
	d.Ready = tn.ready
	tn.Net = New(d)
	return tn
}

// netnsIdentities journals the netns identity only (the node's adds the
// overlay's and the block device's).
type netnsIdentities struct{ tn *testNet }

func (i netnsIdentities) Read(ctx context.Context, rec journal.Sandbox) (journal.Sandbox, bool) {
	return i.tn.IdentifyNetns(ctx, rec)
}
func (netnsIdentities) Put(tx *journal.Tx, rec journal.Sandbox) error {
	s, ok, err := tx.Sandbox(rec.ID)
	if err != nil || !ok {
		return err
	}
	s.NetnsDev, s.NetnsIno, s.NetnsCookie = rec.NetnsDev, rec.NetnsIno, rec.NetnsCookie
	return tx.PutSandbox(s)
}

func (tn testNet) ready(id string) (journal.Sandbox, error) {
	s, ok := tn.sandbox(id)
	if !ok || s.State != journal.StateReady {
		return s, errdefs.Errorf(errdefs.CodeConflict, "sandbox %q is not ready", id)
	}
	return s, nil
}

func (tn testNet) sandbox(id string) (s journal.Sandbox, ok bool) {
	if err := tn.j.View(func(tx *journal.Tx) (err error) {
		s, ok, err = tx.Sandbox(id)
		return err
	}); err != nil {
		panic(err)
	}
	return s, ok
}

// claim admits a ready generation of id with policy p (a slot from the
// carriers or the pool, as a claim's admitting transaction) and makes
// the network's entries for it in order, each with its staged writes.
func (tn testNet) claim(t *testing.T, id string, p journal.NetworkPolicy) journal.Sandbox {
	t.Helper()
	cid := id + "-g1"
	rec := journal.Sandbox{ID: id, Generation: 1, State: journal.StateReady, ContainerID: cid, LeaseID: cid, Netns: cid, Epoch: 1,
		Request: &journal.ClaimRequest{Network: p}}
	err := tn.j.Update(func(tx *journal.Tx) error {
		live, err := tx.LiveSandboxes()
		if err != nil {
			return err
		}
		if err := tn.TakeCarrier(tx, live, &rec); err != nil {
			return err
		}
		return tx.PutSandbox(rec)
	})
	if err != nil {
		t.Fatalf("admit %s: %v", id, err)
	}
	c := &resource.Claim{Rec: rec}
	for _, e := range presentEntries(tn.Net) {
		if err := e.Make(t.Context(), c); err != nil {
			t.Fatalf("make %s of %s: %v", e.Spec().Kind, id, err)
		}
		if staged := c.TakeStaged(); staged != nil {
			if err := tn.j.Update(staged); err != nil {
				t.Fatal(err)
			}
		}
	}
	s, _ := tn.sandbox(id)
	return s
}

// TestEntriesInClaimOrder: the network's entries and their proof checks,
// in claim order (the node's crash points and proofs depend on it).
func TestEntriesInClaimOrder(t *testing.T) {
	var kinds, checks []string
	for _, e := range entries(nil) {
		sp := e.Spec()
		if sp.Phase != resource.PhaseNetwork {
			t.Errorf("%s in phase %v, want the network's", sp.Kind, sp.Phase)
		}
		kinds, checks = append(kinds, string(sp.Kind)), append(checks, sp.Check)
	}
	if want := []string{"netns", "links", "conntrack", "nft", "dns"}; !slices.Equal(kinds, want) {
		t.Errorf("kinds %q, want %q", kinds, want)
	}
	if want := []string{"netns_gone", "veth_gone_address_free", "conntrack_gone", "nft_gone", "dns_state_gone"}; !slices.Equal(checks, want) {
		t.Errorf("checks %q, want %q", checks, want)
	}
}

// TestCheckFailsClosed: a mode the node's subsystems cannot enforce is
// refused (unavailable) before anything is journaled, and so is every
// mode while the term could not make its nft table.
func TestCheckFailsClosed(t *testing.T) {
	check := func(n *Net, p journal.NetworkPolicy) error {
		t.Helper()
		pol, err := n.Parse(p)
		if err != nil {
			t.Fatalf("parse %+v: %v", p, err)
		}
		return n.Check(pol)
	}
	wantRefused := func(err error, what string) {
		t.Helper()
		if err == nil || errdefs.CodeOf(err) != errdefs.CodeUnavailable || !strings.Contains(err.Error(), what) {
			t.Errorf("got %v, want unavailable naming %q", err, what)
		}
	}
	bare := newTestNet(t, 0)
	if err := check(bare.Net, denyAll); err != nil {
		t.Errorf("deny_all without links: %v", err)
	}
	wantRefused(check(bare.Net, restrict), "links and firewall")

	noDNS := newTestNet(t, 0, everyPart, func(d *Wiring, _ *fakekernel.Kernel) { d.DNSProxy = nil })
	noDNS.k.FailMake(journal.KindNft, fakekernel.TableName, nil)
	if err := noDNS.Ensure(t.Context()); err == nil {
		t.Fatal("Ensure with the nft table failing: no error")
	}
	wantRefused(check(noDNS.Net, denyAll), "not ready")
	noDNS.k.ClearFailMake(journal.KindNft, fakekernel.TableName)
	if err := noDNS.Ensure(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !noDNS.k.TableEnsured() || !noDNS.k.Forwarding() {
		t.Errorf("after Ensure: table %v, forwarding %v", noDNS.k.TableEnsured(), noDNS.k.Forwarding())
	}
	if err := check(noDNS.Net, restrict); err != nil {
		t.Errorf("restricted by CIDR without a DNS proxy: %v", err)
	}
	wantRefused(check(noDNS.Net, openPol), "DNS proxy")

	if _, err := noDNS.Parse(journal.NetworkPolicy{Mode: "restricted", Rules: []journal.NetworkRule{{CIDR: "not a cidr"}}}); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
		t.Errorf("a bad rule parses: %v", err)
	}
}

// TestNameservers: the guest's resolvers are its block's gateways (the
// proxy answers there), none without a DNS proxy.
func TestNameservers(t *testing.T) {
	tn := newTestNet(t, 0, everyPart)
	rec := journal.Sandbox{ID: "sb", Generation: 1, Slot: 1}
	ns, err := tn.Nameservers(rec)
	want := []netip.Addr{netip.MustParseAddr("10.200.0.2"), netip.MustParseAddr("fd00:c71d::5")}
	if err != nil || !slices.Equal(ns, want) {
		t.Errorf("nameservers %v %v, want %v", ns, err, want)
	}
	if _, err := tn.Nameservers(journal.Sandbox{ID: "sb", Generation: 1}); err == nil {
		t.Error("a generation with no slot got nameservers")
	}
	bare := newTestNet(t, 0)
	if ns, err := bare.Nameservers(rec); err != nil || ns != nil {
		t.Errorf("without a DNS proxy: %v %v, want none", ns, err)
	}
}

// TestCarriersTakenAndAdopted: the filler makes the pool's carriers on the
// lowest free slots; a claim takes one (its netns and links journaled done
// for the generation, the carrier record gone) and the next claim the
// other; on a takeover a carrier that is not whole is destroyed and its
// slot freed.
func TestCarriersTakenAndAdopted(t *testing.T) {
	tn := newTestNet(t, 2, everyPart)
	ctx := t.Context()
	if err := tn.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tn.fillCarriers(ctx); err != nil {
		t.Fatal(err)
	}
	if cs := tn.carriers(t); len(cs) != 2 || cs[0].State != journal.CarrierReady || cs[1].Slot != 2 {
		t.Fatalf("carriers after the fill: %+v", cs)
	}
	s := tn.claim(t, "sb", denyAll)
	if s.Slot != 1 || s.Netns != CarrierNetns(1) || !TookCarrier(s) || s.NetnsIno == 0 {
		t.Fatalf("claim got slot %d netns %q (ino %d), want carrier 1's", s.Slot, s.Netns, s.NetnsIno)
	}
	var effects []journal.Effect
	if err := tn.j.View(func(tx *journal.Tx) (err error) {
		effects, err = tx.Effects()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var done []string
	for _, e := range effects {
		if e.SandboxID == "sb" && e.State == journal.Done {
			done = append(done, string(e.Kind))
		}
	}
	if want := []string{"links", "netns"}; !slices.Equal(sorted(done), want) {
		t.Errorf("done effects of the claim %q, want %q (the carrier's)", done, want)
	}
	if cs := tn.carriers(t); len(cs) != 1 || cs[0].Slot != 2 {
		t.Fatalf("carriers after the take: %+v", cs)
	}
	// Carrier 2 loses its link behind the journal's back: not whole.
	if err := tn.k.Links().Remove(ctx, netpolicy.LinkName(2)); err != nil {
		t.Fatal(err)
	}
	if err := tn.AdoptCarriers(ctx); err != nil {
		t.Fatal(err)
	}
	if cs := tn.carriers(t); len(cs) != 0 {
		t.Fatalf("carriers after the takeover: %+v, want none", cs)
	}
	if text := tn.k.String(); strings.Contains(text, CarrierNetns(2)) {
		t.Errorf("carrier 2's netns left:\n%s", text)
	}
	// Its slot is free again: the next claim (no carrier left) gets it.
	if s := tn.claim(t, "sb2", denyAll); s.Slot != 2 || TookCarrier(s) {
		t.Errorf("second claim: slot %d, took a carrier %v; want slot 2 made inline", s.Slot, TookCarrier(s))
	}
}

// TestCarrierWaitIsBounded: with no free block but one a carrier is being
// made on, a claim is told to wait (ErrCarrierMaking) and refused as
// capacity exhausted.
func TestCarrierWaitIsBounded(t *testing.T) {
	tn := newTestNet(t, 1, everyPart)
	total := int(testPool.Len())
	err := tn.j.Update(func(tx *journal.Tx) error {
		for slot := 1; slot < total; slot++ {
			if err := tx.PutSandbox(journal.Sandbox{ID: "busy" + string(rune('a'+slot)), Generation: 1, State: journal.StateReady, Slot: uint32(slot)}); err != nil {
				return err
			}
		}
		return tx.PutCarrier(journal.Carrier{Slot: uint32(total), Netns: CarrierNetns(uint32(total)), State: journal.CarrierMaking, Epoch: 1})
	})
	if err != nil {
		t.Fatal(err)
	}
	rec := journal.Sandbox{ID: "sb", Generation: 1, ContainerID: "sb-g1"}
	err = tn.j.Update(func(tx *journal.Tx) error {
		live, err := tx.LiveSandboxes()
		if err != nil {
			return err
		}
		return tn.TakeCarrier(tx, live, &rec)
	})
	if !errors.Is(err, ErrCarrierMaking) || errdefs.CodeOf(err) != errdefs.CodeCapacityExhausted {
		t.Fatalf("claim with the last block's carrier being made: %v", err)
	}
	if tn.CarrierWait() != time.Second {
		t.Errorf("carrier wait %v, want Deps.CarrierWait", tn.CarrierWait())
	}
}

// TestUpdateAndRedo: a live update applies the new policy in one nft
// apply, cuts the flows it no longer allows, tells the DNS proxy and
// journals it in force; an update a crash left intended is redone on
// takeover; Status reports the mode in force.
func TestUpdateAndRedo(t *testing.T) {
	tn := newTestNet(t, 0, everyPart)
	ctx := t.Context()
	if err := tn.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	tn.claim(t, "sb", openPol)
	tn.k.AddFlow(1, allowed)
	tn.k.AddFlow(1, notAllow)
	s, err := tn.Update(ctx, "sb", restrict)
	if err != nil {
		t.Fatal(err)
	}
	if s.NetworkUpdate != nil || s.Network == nil || s.Network.Mode != "restricted" {
		t.Fatalf("update answered network %+v, update %+v", s.Network, s.NetworkUpdate)
	}
	if eff, ok := tn.k.Effective(netpolicy.ChainName("sb", 1)); !ok || eff.Mode != netpolicy.ModeRestricted {
		t.Errorf("chain enforces %v %+v", ok, eff)
	}
	if fs := tn.k.FlowsOf(1); !slices.Equal(fs, []fakekernel.Flow{allowed}) {
		t.Errorf("flows after the update %v, want only %v", fs, allowed)
	}
	if eff, ok := tn.k.Registered(1); !ok || eff.Mode != netpolicy.ModeRestricted {
		t.Errorf("DNS proxy holds %v %+v", ok, eff)
	}
	if j, _ := tn.sandbox("sb"); j.Network == nil || j.Network.Mode != "restricted" || j.NetworkUpdate != nil {
		t.Errorf("journal: network %+v update %+v", j.Network, j.NetworkUpdate)
	}
	if st := tn.Status(ctx, s); st == nil || st.Mode != netpolicy.ModeRestricted {
		t.Errorf("status %+v", st)
	}

	// A crash after the intent: the next term redoes it.
	err = tn.j.Update(func(tx *journal.Tx) error {
		cur, _, err := tx.Sandbox("sb")
		if err != nil {
			return err
		}
		cur.NetworkUpdate = &journal.NetworkUpdate{Policy: denyAll}
		s = cur
		return tx.PutSandbox(cur)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tn.RedoUpdate(ctx, s); err != nil {
		t.Fatal(err)
	}
	if eff, _ := tn.k.Effective(netpolicy.ChainName("sb", 1)); eff.Mode != netpolicy.ModeDenyAll {
		t.Errorf("after the redo the chain enforces %s, want deny_all", eff.Mode)
	}
	if j, _ := tn.sandbox("sb"); j.Network == nil || j.Network.Mode != "deny_all" || j.NetworkUpdate != nil {
		t.Errorf("journal after the redo: network %+v update %+v", j.Network, j.NetworkUpdate)
	}
	if _, err := tn.Update(ctx, "nope", restrict); errdefs.CodeOf(err) != errdefs.CodeConflict {
		t.Errorf("update of an unknown sandbox: %v, want Deps.Ready's error", err)
	}
}

func (tn testNet) carriers(t *testing.T) (cs []journal.Carrier) {
	t.Helper()
	if err := tn.j.View(func(tx *journal.Tx) (err error) {
		cs, err = tx.Carriers()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return cs
}

func sorted(ss []string) []string { slices.Sort(ss); return ss }

// entries are what Register adds for n, in claim order.
func entries(n *Net) []resource.Entry[*resource.Claim] {
	var b resource.Builder[*resource.Claim]
	Register(&b, n)
	return b.Table().All()
}

// presentEntries are n's entries whose subsystem the test configured: a
// claim skips the absent ones (resource's runner does the same).
func presentEntries(n *Net) []resource.Entry[*resource.Claim] {
	var es []resource.Entry[*resource.Claim]
	for _, e := range entries(n) {
		if resource.Present(e) {
			es = append(es, e)
		}
	}
	return es
}

// TestUnconfiguredPartsAreAbsent: a node with a netns but no veth,
// firewall, conntrack or DNS proxy registers those entries absent (its
// claims skip them: a deny_all sandbox with only lo), decided once by New;
// with them all, every entry is present.
func TestUnconfiguredPartsAreAbsent(t *testing.T) {
	bare := newTestNet(t, 0).Net
	var present []string
	for _, e := range entries(bare) {
		if resource.Present(e) {
			present = append(present, string(e.Spec().Kind))
		}
	}
	if want := []string{"netns"}; !slices.Equal(present, want) {
		t.Errorf("present on a node with only netns: %q, want %q", present, want)
	}
	var b resource.Builder[*resource.Claim]
	Register(&b, bare)
	var all resource.Builder[*resource.Claim]
	Register(&all, newTestNet(t, 0, everyPart).Net)
	for _, e := range all.Table().All() {
		if !resource.Present(e) {
			t.Errorf("%s absent on a node with every part", e.Spec().Kind)
		}
	}
	var claimed []string
	for _, e := range b.Table().Claim(journal.Sandbox{}) {
		claimed = append(claimed, string(e.Spec().Kind))
	}
	if want := []string{"netns"}; !slices.Equal(claimed, want) {
		t.Errorf("a claim on a node with only netns makes %q, want %q", claimed, want)
	}
}
