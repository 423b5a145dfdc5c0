package ktest

import (
	"slices"
	"testing"
)

// A router solicitation dropped between two listings changes only the
// input chain's counter: the normal forms are equal. A changed rule is not.
func TestNormalRulesetIgnoresCounters(t *testing.T) {
	const (
		before = `{"nftables": [{"metainfo": {"version": "1.0.6"}}, {"rule": {"chain": "input", "handle": 15, "expr": [{"counter": {"packets": 0, "bytes": 0}}, {"drop": null}]}}]}`
		after  = `{"nftables": [{"metainfo": {"version": "1.0.7"}}, {"rule": {"handle": 15, "chain": "input", "expr": [{"counter": {"packets": 1, "bytes": 56}}, {"drop": null}]}}]}`
		other  = `{"nftables": [{"rule": {"chain": "input", "handle": 15, "expr": [{"counter": {"packets": 0, "bytes": 0}}, {"accept": null}]}}]}`
	)
	b, err := normalRuleset([]byte(before))
	if err != nil {
		t.Fatal(err)
	}
	a, err := normalRuleset([]byte(after))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(a, b) {
		t.Errorf("counters changed the ruleset:\n%q\n%q", b, a)
	}
	o, err := normalRuleset([]byte(other))
	if err != nil {
		t.Fatal(err)
	}
	if slices.Equal(o, b) {
		t.Errorf("a drop and an accept rule normalize equal: %q", o)
	}
}
