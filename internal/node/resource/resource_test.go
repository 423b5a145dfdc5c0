package resource

import (
	"context"
	"slices"
	"testing"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/proof"
)

type testEntry struct {
	spec   Spec
	needed func(journal.Sandbox) bool
}

func (e testEntry) Spec() Spec                                      { return e.spec }
func (testEntry) Make(context.Context, struct{}) error              { return nil }
func (testEntry) Remove(context.Context, journal.Sandbox) error     { return nil }
func (testEntry) Gone(context.Context, journal.Sandbox) proof.Check { return proof.Check{OK: true} }

type neededEntry struct{ testEntry }

func (e neededEntry) Needed(rec journal.Sandbox) bool { return e.needed(rec) }

func kinds(es []Entry[struct{}]) []journal.Kind {
	var out []journal.Kind
	for _, e := range es {
		out = append(out, e.Spec().Kind)
	}
	return out
}

// TestTableOrderAndViews: claim order is by phase, then registration; For
// drops the other mode's entries, Claim also the unneeded; crash points
// and timing phases come from the specs.
func TestTableOrderAndViews(t *testing.T) {
	var b Builder[struct{}]
	b.Add(testEntry{spec: Spec{Kind: "guest", Phase: PhaseGuest, Check: "g"}}, true)
	b.Add(testEntry{spec: Spec{Kind: "blk", Phase: PhaseRootFS, Mode: journal.RootFSBlock, Check: "b"}}, true)
	b.Add(testEntry{spec: Spec{Kind: "lease", Phase: PhaseLease, Check: "l"}}, true)
	b.Add(neededEntry{testEntry{spec: Spec{Kind: "vol", Phase: PhaseRootFS, Check: "v", RemovePoints: []string{"vol:sealed"}},
		needed: func(rec journal.Sandbox) bool { return rec.Request != nil }}}, true)
	b.Add(testEntry{spec: Spec{Kind: "net", Phase: PhaseNetwork, Check: "n", Sweeps: true}}, false)
	tab := b.Table()
	if got, want := kinds(tab.All()), []journal.Kind{"lease", "blk", "vol", "net", "guest"}; !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
	if got, want := kinds(tab.For(journal.Sandbox{})), []journal.Kind{"lease", "vol", "net", "guest"}; !slices.Equal(got, want) {
		t.Errorf("overlay entries %v, want %v", got, want)
	}
	if got, want := kinds(tab.Claim(journal.Sandbox{})), []journal.Kind{"lease", "net", "guest"}; !slices.Equal(got, want) {
		t.Errorf("claim entries without volumes %v, want %v", got, want)
	}
	if got := kinds(tab.Claim(journal.Sandbox{Request: &journal.ClaimRequest{}})); !slices.Contains(got, "vol") {
		t.Errorf("claim entries with volumes %v lack vol", got)
	}
	pts := tab.CrashPoints([]string{"extra"})
	for _, p := range []string{"lease:intended", "vol:removing", "vol:sealed", "vol:removed", "extra", "proof:signed", "orphan:guest"} {
		if !slices.Contains(pts, p) {
			t.Errorf("crash points lack %s: %v", p, pts)
		}
	}
	if i, j := slices.Index(pts, "vol:sealed"), slices.Index(pts, "vol:removing"); i != j+1 {
		t.Errorf("vol:sealed not right after vol:removing: %v", pts)
	}
	var tm journal.Timings
	ph := tab.Phases(&tm)
	*ph["lease"] += 1
	*ph["vol"] += 2
	*ph["net"] += 3
	*ph["guest"] += 4
	if tm.LeaseMS != 1 || tm.RootFSMS != 2 || tm.NetworkMS != 3 || tm.RunscMS != 4 {
		t.Errorf("timings %+v", tm)
	}
	net := tab.Kind("net")
	if Present(net) || !Present(tab.Kind("lease")) || net.Spec().Sweeps {
		t.Errorf("absent net: present %v, sweeps %v", Present(net), net.Spec().Sweeps)
	}
	if err := net.Make(context.Background(), struct{}{}); errdefs.CodeOf(err) != errdefs.CodeUnavailable {
		t.Errorf("absent Make: %v, want unavailable", err)
	}
	if c := net.Gone(context.Background(), journal.Sandbox{}); !c.OK || c.Name != "n" {
		t.Errorf("absent Gone: %+v", c)
	}
}

// TestAbsentEntriesInAClaim: a claim skips an absent optional entry (a
// node without the subsystem runs its generations without it) and an
// absent entry its generation does not need; an absent entry it needs
// stays, and its Make refuses.
func TestAbsentEntriesInAClaim(t *testing.T) {
	var b Builder[struct{}]
	b.Add(testEntry{spec: Spec{Kind: "lease", Phase: PhaseLease, Check: "l"}}, true)
	b.Add(testEntry{spec: Spec{Kind: "veth", Phase: PhaseNetwork, Check: "v", Optional: true}}, false)
	b.Add(neededEntry{testEntry{spec: Spec{Kind: "vol", Phase: PhaseRootFS, Check: "o"},
		needed: func(rec journal.Sandbox) bool { return rec.Request != nil }}}, false)
	b.Add(testEntry{spec: Spec{Kind: "blk", Phase: PhaseRootFS, Check: "b"}}, false)
	tab := b.Table()
	if got, want := kinds(tab.Claim(journal.Sandbox{})), []journal.Kind{"lease", "blk"}; !slices.Equal(got, want) {
		t.Errorf("claim without volumes %v, want %v", got, want)
	}
	got := tab.Claim(journal.Sandbox{Request: &journal.ClaimRequest{}})
	if want := []journal.Kind{"lease", "vol", "blk"}; !slices.Equal(kinds(got), want) {
		t.Errorf("claim with volumes %v, want %v", kinds(got), want)
	}
	if err := got[1].Make(context.Background(), struct{}{}); errdefs.CodeOf(err) != errdefs.CodeUnavailable {
		t.Errorf("absent vol's Make: %v, want unavailable", err)
	}
	if got, want := kinds(tab.For(journal.Sandbox{})), []journal.Kind{"lease", "vol", "blk", "veth"}; !slices.Equal(got, want) {
		t.Errorf("teardown entries %v, want %v (every check runs)", got, want)
	}
}

// TestAbsentEntrySurvey: on a node without its subsystem, a ready
// generation that needs the entry has lost it; an optional one, nothing.
func TestAbsentEntrySurvey(t *testing.T) {
	var b Builder[struct{}]
	b.Add(testEntry{spec: Spec{Kind: "veth", Phase: PhaseNetwork, Check: "v", Optional: true}}, false)
	b.Add(testEntry{spec: Spec{Kind: "blk", Phase: PhaseRootFS, Check: "b"}}, false)
	tab := b.Table()
	ctx := context.Background()
	for kind, want := range map[journal.Kind]string{"veth": "", "blk": "blk (not configured on this node)"} {
		l, ok := tab.Kind(kind).(Liveness)
		if !ok {
			t.Fatalf("absent %s has no survey", kind)
		}
		m, err := l.Survey(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := m(ctx, journal.Sandbox{}); got != want {
			t.Errorf("absent %s: missing %q, want %q", kind, got, want)
		}
	}
}
