package overlay

import (
	"testing"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
)

// TestDiskProjectAllocation: the lowest id of the range that no generation
// holding capacity uses; withheld generations keep theirs; a full range is
// capacity_exhausted.
func TestDiskProjectAllocation(t *testing.T) {
	n := New(Config{DiskProjects: DiskProjects{Base: 100, Count: 3}}, Deps{})
	rec := func(state journal.State, p uint32, withheld bool) journal.Sandbox {
		return journal.Sandbox{State: state, DiskProject: p, Withheld: withheld}
	}
	for _, c := range []struct {
		name string
		all  []journal.Sandbox
		want uint32
	}{
		{"empty", nil, 100},
		{"ready holds", []journal.Sandbox{rec(journal.StateReady, 100, false)}, 101},
		{"released frees", []journal.Sandbox{rec(journal.StateReleased, 100, false)}, 100},
		{"withheld keeps", []journal.Sandbox{rec(journal.StateReleased, 100, true), rec(journal.StateClaiming, 101, false)}, 102},
		{"lost holds", []journal.Sandbox{rec(journal.StateLost, 100, false)}, 101},
	} {
		got, err := n.AllocDiskProject(c.all)
		if err != nil || got != c.want {
			t.Errorf("%s: %d, %v; want %d", c.name, got, err, c.want)
		}
	}
	full := []journal.Sandbox{rec(journal.StateReady, 100, false), rec(journal.StateReady, 101, false), rec(journal.StateReleasing, 102, false)}
	if _, err := n.AllocDiskProject(full); errdefs.CodeOf(err) != errdefs.CodeCapacityExhausted {
		t.Fatalf("full range: %v, want capacity_exhausted", err)
	}
}

// TestDiskDefault: a claim without disk_bytes gets the node's default; one
// with it keeps its own.
func TestDiskDefault(t *testing.T) {
	n := New(Config{DefaultDiskBytes: 1 << 30}, Deps{})
	if r := n.WithDiskDefault(journal.Resources{}); r.DiskBytes != 1<<30 {
		t.Fatalf("default not applied: %d", r.DiskBytes)
	}
	if r := n.WithDiskDefault(journal.Resources{DiskBytes: 5 << 20}); r.DiskBytes != 5<<20 {
		t.Fatalf("explicit disk_bytes replaced: %d", r.DiskBytes)
	}
	if err := New(Config{}, Deps{}).CheckDisk(journal.Resources{}); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
		t.Fatalf("no disk lease and no default: %v, want invalid_argument", err)
	}
}
