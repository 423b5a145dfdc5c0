package netbench

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/netpolicy"
)

// churnGenerations is how many generations' networks the churn test
// makes (all live at once) and removes: CTLD_CHURN_GENERATIONS, 50 by
// default so `make test` stays short (about 0.5 s a generation under
// TCG); `make churn` runs issue 8's 200.
func churnGenerations() int { return envInt("CTLD_CHURN_GENERATIONS", 50) }

// TestKernelNetworkChurn makes churnGenerations() generations' networks (netns, links,
// a restricted policy, TCP and UDP flows to a test host), proves for a
// sample that the policy holds (allowed port reachable, another not),
// finds an orphan link and chain by List in the middle, removes all, and
// then checks each subsystem's proof and that the ruleset, links,
// addresses, netns, mounts and conntrack table equal the baseline taken
// before.
func TestKernelNetworkChurn(t *testing.T) {
	ktest.Require(t)
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	r := newRig(t, true)
	p := r.policy("8080")
	before := r.state()

	var gens []*gen
	t.Cleanup(func() {
		for _, g := range gens {
			_ = r.remove(g) // after a failure: leave nothing behind
		}
	})
	known := func() (links, chains []string) {
		for _, g := range gens {
			links = append(links, g.owner.Link())
			chains = append(chains, g.owner.Chain())
		}
		slices.Sort(links)
		slices.Sort(chains)
		return
	}

	n := churnGenerations()
	t0 := time.Now()
	for i := range n {
		g := r.alloc(fmt.Sprintf("nb%03d", i))
		gens = append(gens, g)
		r.make(g, p)
		// Flows of every generation: a TCP echo and a UDP round trip.
		c, err := r.dialTCP(g, 8080, 3*time.Second)
		if err != nil {
			t.Fatalf("%s: tcp 8080 (allowed): %v", g.name, err)
		}
		err = echoTCP(c, "churn "+g.name)
		c.Close()
		if err != nil {
			t.Fatalf("%s: tcp echo: %v", g.name, err)
		}
		if err := r.echoUDP(g); err != nil {
			t.Fatalf("%s: udp 5353 (allowed): %v", g.name, err)
		}
		if ok, d := r.ct.CheckGone(r.ctx, g.owner.Block.Slot); ok || !strings.HasPrefix(d, "2 conntrack flows") {
			t.Fatalf("%s: conntrack: %v %q; want its tcp and udp flows", g.name, ok, d)
		}
		if i%20 == 0 { // the sample: a port the policy does not name
			if c, err := r.dialTCP(g, 8081, 500*time.Millisecond); err == nil {
				c.Close()
				t.Fatalf("%s: tcp 8081 connected; the policy allows only 8080", g.name)
			}
		}
		if i == n/2 {
			orphan(t, r, known)
		}
	}
	t.Logf("made %d generations' networks with flows in %v", len(gens), time.Since(t0).Round(time.Millisecond))
	if got, err := r.ns.List(r.ctx); err != nil || len(got) != n {
		t.Fatalf("Netns.List with all live: %d names, %v; want %d", len(got), err, n)
	}
	wantLinks, wantChains := known()
	if got, err := r.links.List(r.ctx); err != nil || !slices.Equal(got, wantLinks) {
		t.Fatalf("Links.List with all live: %v (%d links, want %d)", err, len(got), len(wantLinks))
	}
	if got, err := r.fw.List(r.ctx); err != nil || !slices.Equal(got, wantChains) {
		t.Fatalf("Firewall.List with all live: %v (%d chains, want %d)", err, len(got), len(wantChains))
	}

	t0 = time.Now()
	var bad []string
	for len(gens) > 0 {
		g := gens[0]
		if err := r.remove(g); err != nil {
			t.Fatal(err)
		}
		gens = gens[1:]
		bad = append(bad, r.checkGone(g)...)
	}
	t.Logf("removed them in %v", time.Since(t0).Round(time.Millisecond))
	for _, b := range bad {
		t.Errorf("cleanup proof: %s", b)
	}
	if d := diff(before, r.state()); len(d) > 0 {
		t.Errorf("after removing every generation the node differs from the baseline:\n%s", strings.Join(d, "\n"))
	}
}

// orphan makes a generation's links and nft objects that no generation of
// the test owns (as after a crash between the kernel and the journal),
// checks that List finds exactly them beyond the known ones, and removes
// them as the reconciler does (RemoveOrphan, Links.Remove).
func orphan(t *testing.T, r *rig, known func() (links, chains []string)) {
	t.Helper()
	g := r.alloc("nborphan")
	r.make(g, r.policy("8080"))
	links, chains := known()
	gotLinks, err := r.links.List(r.ctx)
	if err != nil {
		t.Fatal(err)
	}
	gotChains, err := r.fw.List(r.ctx)
	if err != nil {
		t.Fatal(err)
	}
	extra := func(got, want []string) []string {
		return slices.DeleteFunc(slices.Clone(got), func(x string) bool { return slices.Contains(want, x) })
	}
	if e := extra(gotLinks, links); !slices.Equal(e, []string{g.owner.Link()}) {
		t.Errorf("Links.List beyond the %d known links: %v; want the orphan %s", len(links), e, g.owner.Link())
	}
	if e := extra(gotChains, chains); !slices.Equal(e, []string{g.owner.Chain()}) {
		t.Errorf("Firewall.List beyond the %d known chains: %v; want the orphan %s", len(chains), e, g.owner.Chain())
	}
	if slot, ok := netpolicy.ParseLinkName(g.owner.Link()); !ok || slot != g.owner.Block.Slot {
		t.Errorf("ParseLinkName(%s) = %d, %v", g.owner.Link(), slot, ok)
	}
	if err := r.fw.RemoveOrphan(r.ctx, g.owner.Chain()); err != nil {
		t.Fatal(err)
	}
	if err := r.remove(g); err != nil {
		t.Fatal(err)
	}
	if bad := r.checkGone(g); len(bad) > 0 {
		t.Errorf("orphan not gone: %v", bad)
	}
	t.Logf("orphan %s (%s) found by List among %d live generations and removed", g.owner.Chain(), g.owner.Link(), len(links))
}
