package node

import (
	"slices"
	"testing"

	"github.com/ctld/ctld/internal/journal"
)

// TestTableKindsCoveredEverywhere: every entry of the resource table has a
// unique kind, a claim timing phase and all its crash points listed, so a
// new entry cannot be half added.
func TestTableKindsCoveredEverywhere(t *testing.T) {
	n := &Node{}
	table := newTable(n)
	points := CrashPoints()
	var tm journal.Timings
	phase := claimPhases(&tm)
	seen := map[journal.Kind]bool{}
	for _, r := range table {
		k := r.kind()
		ks := string(k)
		if seen[k] {
			t.Errorf("kind %q twice in the table", k)
		}
		seen[k] = true
		if phase[k] == nil {
			t.Errorf("kind %q has no claim timing phase", k)
		}
		for _, p := range []string{ks + ":intended", ks + ":made", ks + ":done", ks + ":removing", ks + ":removed", "orphan:" + ks} {
			if !slices.Contains(points, p) {
				t.Errorf("crash point %q not listed by CrashPoints", p)
			}
		}
	}
	if len(phase) != len(table) {
		t.Errorf("claim phases name %d kinds, the table has %d", len(phase), len(table))
	}
	if !slices.Contains(points, "proof:signed") {
		t.Error("crash point proof:signed not listed")
	}
	uniq := slices.Clone(points)
	slices.Sort(uniq)
	if len(slices.Compact(uniq)) != len(points) {
		t.Errorf("CrashPoints lists a point twice: %v", points)
	}
	// Teardown order is the reverse of claim order: the guest goes first,
	// its logs last (after the cgroup and the log writer in it).
	if table[len(table)-1].kind() != "runsc" || table[0].kind() != "logs" {
		t.Errorf("table order %v: want logs first and runsc last", kinds(table))
	}
}

func kinds(t []resource) []journal.Kind {
	var out []journal.Kind
	for _, r := range t {
		out = append(out, r.kind())
	}
	return out
}
