package pvolume

import (
	"testing"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
)

// TestAdmit: a volume has one writer on a node: a claim naming a volume
// that another generation holds (live or withheld) is a conflict; the
// claim's own generation and generations that hold nothing are not.
func TestAdmit(t *testing.T) {
	gen := func(id string, g uint64, st journal.State, withheld bool, vols ...string) journal.Sandbox {
		req := &journal.ClaimRequest{}
		for _, v := range vols {
			req.Volumes = append(req.Volumes, journal.VolumeMount{ID: v, Path: "/data/" + v})
		}
		return journal.Sandbox{ID: id, Generation: g, State: st, Withheld: withheld, Request: req}
	}
	claim := gen("a", 2, journal.StateClaiming, false, "v1")
	cases := []struct {
		name     string
		live     []journal.Sandbox
		conflict bool
	}{
		{"nobody holds it", []journal.Sandbox{claim, gen("b", 1, journal.StateReady, false, "v2")}, false},
		{"its own record", []journal.Sandbox{claim}, false},
		{"held by a ready generation", []journal.Sandbox{claim, gen("b", 1, journal.StateReady, false, "v1")}, true},
		{"held by an earlier generation of the same sandbox", []journal.Sandbox{claim, gen("a", 1, journal.StateReleasing, false, "v1")}, true},
		{"held by a withheld generation", []journal.Sandbox{claim, gen("b", 1, journal.StateReleased, true, "v1")}, true},
		{"released, not withheld", []journal.Sandbox{claim, gen("b", 1, journal.StateReleased, false, "v1")}, false},
	}
	for _, c := range cases {
		err := Admit(c.live, claim)
		if got := errdefs.CodeOf(err) == errdefs.CodeConflict; got != c.conflict {
			t.Errorf("%s: %v, want conflict %v", c.name, err, c.conflict)
		}
	}
	if err := Admit([]journal.Sandbox{gen("b", 1, journal.StateReady, false, "v1")}, journal.Sandbox{ID: "a", Generation: 1}); err != nil {
		t.Errorf("a claim without a request: %v, want admitted", err)
	}
}
