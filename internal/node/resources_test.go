package node

import (
	"context"
	"slices"
	"testing"

	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/network"
	"github.com/ctld/ctld/internal/node/resource"
	"github.com/ctld/ctld/internal/proof"
)

// TestTableKindsCoveredEverywhere: every entry of the resource table has a
// unique kind, a claim timing phase, a proof check and all its crash
// points listed, so a new entry cannot be half added.
func TestTableKindsCoveredEverywhere(t *testing.T) {
	table := newTable(&Node{})
	checkTableCovered(t, table, CrashPoints())
	// Teardown order is the reverse of claim order: the guest goes first,
	// its logs last (after the cgroup and the log writer in it).
	all := table.All()
	if all[len(all)-1].Spec().Kind != "runsc" || all[0].Spec().Kind != "logs" {
		t.Errorf("table order %v: want logs first and runsc last", kinds(all))
	}
	// Today's claim order, which the phases and registration derive.
	want := []journal.Kind{"logs", "cgroup", "disk", "mount", "writer", "blockmount", "volumes",
		"netns", "links", "conntrack", "nft", "dns", "agent", "bundle", "runsc"}
	if !slices.Equal(kinds(all), want) {
		t.Errorf("table order %v, want %v", kinds(all), want)
	}
}

// checkTableCovered is the table-coverage check of table, whose crash
// points are points.
func checkTableCovered(t *testing.T, table *resource.Table[*resource.Claim], points []string) {
	t.Helper()
	var tm journal.Timings
	phase := table.Phases(&tm)
	seen := map[journal.Kind]bool{}
	for _, r := range table.All() {
		sp := r.Spec()
		k := sp.Kind
		ks := string(k)
		if seen[k] {
			t.Errorf("kind %q twice in the table", k)
		}
		seen[k] = true
		if phase[k] == nil {
			t.Errorf("kind %q has no claim timing phase", k)
		}
		if sp.Check == "" {
			t.Errorf("kind %q names no proof check", k)
		}
		for _, p := range append([]string{ks + ":intended", ks + ":made", ks + ":done", ks + ":removing", ks + ":removed", "orphan:" + ks}, sp.RemovePoints...) {
			if !slices.Contains(points, p) {
				t.Errorf("crash point %q not listed by CrashPoints", p)
			}
		}
	}
	if len(phase) != len(table.All()) {
		t.Errorf("claim phases name %d kinds, the table has %d", len(phase), len(table.All()))
	}
	if !slices.Contains(points, "proof:signed") {
		t.Error("crash point proof:signed not listed")
	}
	uniq := slices.Clone(points)
	slices.Sort(uniq)
	if len(slices.Compact(uniq)) != len(points) {
		t.Errorf("CrashPoints lists a point twice: %v", points)
	}
}

// scratchKind is a test-only kind of generation resource: adding a kind is
// this one type plus one registration line (TestAddingAKind).
type scratchKind struct{ made *[]string }

func (scratchKind) Spec() resource.Spec {
	return resource.Spec{Kind: "scratch", Phase: resource.PhaseRootFS, Check: "scratch_gone", Sweeps: true}
}
func (k scratchKind) Make(_ context.Context, c *resource.Claim) error {
	*k.made = append(*k.made, c.Rec.ContainerID)
	return nil
}
func (k scratchKind) Remove(_ context.Context, rec journal.Sandbox) error {
	*k.made = slices.DeleteFunc(*k.made, func(s string) bool { return s == rec.ContainerID })
	return nil
}
func (k scratchKind) Gone(_ context.Context, rec journal.Sandbox) proof.Check {
	return proof.Check{Name: "scratch_gone", OK: !slices.Contains(*k.made, rec.ContainerID)}
}

// TestAddingAKind: a new kind registered with one line is in the claim
// order by its phase, has its crash points and timing phase, and passes
// the table-coverage check; absent, it keeps its spec and its proof check
// holds only while the journal has no effect of its kind.
func TestAddingAKind(t *testing.T) {
	var made []string
	var b resource.Builder[*resource.Claim]
	register(&b, &Node{})
	b.Add(scratchKind{&made}, true) // the one registration line
	table := b.Table()
	checkTableCovered(t, table, table.CrashPoints(network.UpdateCrashPoints()))
	got := kinds(table.For(journal.Sandbox{}))
	if i := slices.Index(got, "scratch"); i < 0 || got[i-1] != "volumes" || got[i+1] != "netns" {
		t.Errorf("overlay claim order %v: want scratch after the RootFS phase's entries, before the network's", got)
	}

	var ab resource.Builder[*resource.Claim]
	ab.Add(scratchKind{&made}, false)
	e := ab.Table().Kind("scratch")
	if resource.Present(e) || e.Spec().Sweeps || e.Spec().Check != "scratch_gone" {
		t.Fatalf("absent entry: present %v, spec %+v", resource.Present(e), e.Spec())
	}
	if err := e.Make(context.Background(), &resource.Claim{}); err == nil {
		t.Error("an absent entry made something")
	}
	if c := resource.AbsentCheck(e.Spec(), false); !c.OK || c.Name != "scratch_gone" {
		t.Errorf("absent and never journaled: %+v, want ok", c)
	}
	if c := resource.AbsentCheck(e.Spec(), true); c.OK {
		t.Errorf("absent but journaled: %+v, want not ok", c)
	}
}

// TestAddedKindRunsThroughTheNode: the kind added by its one line is
// journaled and made by a claim, removed by the release, and its check is
// in the clean proof, with no other edit of the node.
func TestAddedKindRunsThroughTheNode(t *testing.T) {
	tk, k := fakeKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	var made []string
	var b resource.Builder[*resource.Claim]
	register(&b, r.n)
	b.Add(scratchKind{&made}, true) // the one registration line
	r.n.table = b.Table()

	cid := containerID(sb, 1)
	r.mustClaim(sb, claimReq("c1", 1))
	if !slices.Equal(made, []string{cid}) {
		t.Errorf("after the claim the scratch kind holds %q, want [%s]", made, cid)
	}
	if e, ok := r.effects()["scratch/"+cid]; !ok || e.State != journal.Done {
		t.Errorf("scratch effect of the claim: %v %+v, want done", ok, e)
	}
	r.mustRelease(sb, "r1", 1)
	if len(made) != 0 {
		t.Errorf("after the release the scratch kind holds %q", made)
	}
	p := r.checkProof("r1")
	if !slices.ContainsFunc(p.Checks, func(c proof.Check) bool { return c.Name == "scratch_gone" && c.OK }) {
		t.Errorf("proof checks %+v lack an ok scratch_gone", p.Checks)
	}
	if got := k.String(); got != "" {
		t.Errorf("the kernel after the release:\n%s", got)
	}
}

func kinds(t []entry) []journal.Kind {
	var out []journal.Kind
	for _, r := range t {
		out = append(out, r.Spec().Kind)
	}
	return out
}
