package network

import (
	"context"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/netpolicy"
	"github.com/ctld/ctld/internal/netpolicy/flows"
	"github.com/ctld/ctld/internal/netpolicy/nft"
	"github.com/ctld/ctld/internal/node/op"
	"github.com/ctld/ctld/internal/node/resource"
)

// TestKernelNetworkAlone: the package without the node, on the test VM's
// kernel (netns, veth pairs, an nft table of its own, conntrack): a warm
// carrier is made, a generation takes it and gets its chain, a live
// update applies in nft, the generation's entries are removed in reverse
// order with every proof check passing, and a primary keeping no pool
// destroys the carrier made next. Nothing is left (ktest.CheckLeaks).
func TestKernelNetworkAlone(t *testing.T) {
	ktest.Require(t)
	run := t.TempDir()
	ktest.CheckLeaks(t, ktest.SnapshotOptions{RunDir: run})
	ctx := context.Background()
	pool := netpolicy.Pool{V4: netip.MustParsePrefix("10.234.0.0/24"), V6: netip.MustParsePrefix("fd00:c71d:e3e::/64")}
	// After the leak check's snapshot: the table is the test's own to
	// delete (ctld never deletes its table).
	fw, err := nft.New(nft.Config{Table: ktest.NftTable(t, "ctld-net-"), DNSPort: 10053, Pool: pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	j, err := journal.Open(filepath.Join(run, "journal.db"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	if err := j.TakeOver(1); err != nil {
		t.Fatal(err)
	}
	ns := &netpolicy.Netns{Dir: filepath.Join(run, "netns")}
	newNet := func(carriers int) testNet {
		term := op.NewTerm(ctx)
		d := Wiring{
			Deps: Deps{Netns: ns, Links: &netpolicy.Links{}, Firewall: fw, Flows: &flows.Conntrack{}, Pool: pool},
			Term: term, Run: &op.Runner{J: j, Epoch: 1, Term: term}, Locks: &op.Locks{}, Carriers: carriers,
		}
		tn := testNet{j: j}
		d.Identities, d.Ready = netnsIdentities{&tn}, tn.ready
		tn.Net = New(d)
		return tn
	}
	tn := newNet(1)
	if err := tn.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tn.fillCarriers(ctx); err != nil {
		t.Fatal(err)
	}
	s := tn.claim(t, "sb", denyAll)
	if !TookCarrier(s) || s.Slot != 1 || s.NetnsIno == 0 {
		t.Fatalf("claim: slot %d netns %q ino %d; want carrier 1's", s.Slot, s.Netns, s.NetnsIno)
	}
	chains, err := fw.List(ctx)
	if err != nil || !slices.Contains(chains, netpolicy.ChainName("sb", 1)) {
		t.Fatalf("nft lists %q %v, want the generation's chain", chains, err)
	}
	if s, err = tn.Update(ctx, "sb", restrict); err != nil {
		t.Fatal(err)
	}
	if st := tn.Status(ctx, s); st == nil || st.Mode != netpolicy.ModeRestricted {
		t.Errorf("status after the update: %+v", st)
	}
	// Teardown: the entries in reverse order, each proven gone.
	es := presentEntries(tn.Net)
	slices.Reverse(es)
	for _, e := range es {
		if err := e.Remove(ctx, s); err != nil {
			t.Errorf("remove %s: %v", e.Spec().Kind, err)
		}
	}
	for _, e := range es {
		if c := e.Gone(ctx, s); !c.OK {
			t.Errorf("check %s: %s", c.Name, c.Detail)
		}
	}
	// The pool is refilled on slot 2; a primary keeping no pool destroys
	// that carrier on its takeover.
	if err := tn.fillCarriers(ctx); err != nil {
		t.Fatal(err)
	}
	if cs := tn.carriers(t); len(cs) != 1 || cs[0].State != journal.CarrierReady {
		t.Fatalf("carriers after the refill: %+v", cs)
	}
	next := newNet(0)
	if err := next.AdoptCarriers(ctx); err != nil {
		t.Fatal(err)
	}
	if cs := next.carriers(t); len(cs) != 0 {
		t.Fatalf("carriers kept by a primary with no pool: %+v", cs)
	}
	for _, l := range []resource.Lister{netnsResource{next.Net}, linksResource{next.Net}, nftResource{next.Net}} {
		if names, err := l.List(ctx); err != nil || len(names) > 0 {
			t.Errorf("%T lists %q %v after all, want nothing", l, names, err)
		}
	}
}
