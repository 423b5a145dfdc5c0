package netbench

import (
	"strings"
	"testing"
)

// A baseline flow that expired during the churn is no leak; a flow the
// churn added is, and so is any other kind of object gone or added.
func TestDiffIgnoresExpiredBaselineFlows(t *testing.T) {
	before := state{Conntrack: []string{"proto 6 a -> b mark 0x0"}, Links: []string{"lo"}}
	if d := diff(before, state{Links: []string{"lo"}}); len(d) != 0 {
		t.Errorf("an expired baseline flow was reported: %q", d)
	}
	d := diff(before, state{Conntrack: []string{"proto 6 c -> d mark 0x5"}})
	got := strings.Join(d, "\n")
	if !strings.Contains(got, "conntrack: 1 more than the baseline") || !strings.Contains(got, "links: 1 of the baseline missing") {
		t.Errorf("diff = %q, want the added flow and the missing link", d)
	}
}
