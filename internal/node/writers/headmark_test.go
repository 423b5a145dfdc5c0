package writers

import (
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
)

// TestCheckHeadFloor: the floor check as data: below the node's mark or
// the claim's expected head (a lower seq, or the same seq over another
// generation) is a conflict; at or above either is taken.
func TestCheckHeadFloor(t *testing.T) {
	h := func(seq, gen uint64) journal.VolumeHead { return journal.VolumeHead{Seq: seq, Generation: gen} }
	m := func(seq, gen uint64) journal.HeadMark { return journal.HeadMark{Seq: seq, Generation: gen} }
	cases := []struct {
		name   string
		got    journal.VolumeHead
		mark   journal.HeadMark
		expect journal.VolumeHead
		refuse string
	}{
		{"no floor", h(0, 0), m(0, 0), h(0, 0), ""},
		{"at the mark", h(2, 2), m(2, 2), h(0, 0), ""},
		{"above both", h(3, 3), m(2, 2), h(1, 1), ""},
		{"below the mark", h(1, 1), m(2, 2), h(0, 0), "this node's journal"},
		{"every head gone", h(0, 0), m(2, 2), h(0, 0), "this node's journal"},
		{"same seq, other generation", h(2, 1), m(2, 2), h(0, 0), "this node's journal"},
		{"below the claim", h(2, 2), m(2, 2), h(3, 3), "the claim"},
		{"below the claim, no mark", h(1, 1), m(0, 0), h(2, 2), "the claim"},
	}
	for _, c := range cases {
		err := checkHeadFloor("sandboxes/s", c.got, c.mark, c.expect)
		switch {
		case c.refuse == "" && err != nil:
			t.Errorf("%s: %v, want taken", c.name, err)
		case c.refuse != "" && (errdefs.CodeOf(err) != errdefs.CodeConflict || !strings.Contains(err.Error(), c.refuse)):
			t.Errorf("%s: %v, want a conflict naming %q", c.name, err, c.refuse)
		}
	}
}
