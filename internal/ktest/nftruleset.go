package ktest

import (
	"encoding/json"
	"os/exec"
	"testing"
)

// NftRuleset is `nft -j list ruleset`, one canonical JSON string per entry,
// without the metainfo entry and with every counter's packets and bytes
// zeroed: the base chains' anonymous counters count the sandboxes'
// dropped packets (router solicitations to the node, for one), which a
// run changes without leaving anything behind.
func NftRuleset(tb testing.TB) []string {
	tb.Helper()
	out, err := exec.Command("nft", "-j", "list", "ruleset").Output()
	if err != nil {
		tb.Fatalf("nft -j list ruleset: %v", err)
	}
	entries, err := normalRuleset(out)
	if err != nil {
		tb.Fatalf("nft -j list ruleset: %v", err)
	}
	return entries
}

// normalRuleset is NftRuleset's form of `nft -j list ruleset` output.
func normalRuleset(out []byte) ([]string, error) {
	var doc struct {
		Nftables []map[string]any `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return nil, err
	}
	var entries []string
	for _, e := range doc.Nftables {
		if _, ok := e["metainfo"]; ok {
			continue
		}
		zeroCounters(e)
		b, err := json.Marshal(e) // maps marshal with sorted keys
		if err != nil {
			return nil, err
		}
		entries = append(entries, string(b))
	}
	return entries, nil
}

func zeroCounters(v any) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if c, ok := x.(map[string]any); ok && k == "counter" {
				for _, f := range []string{"packets", "bytes"} {
					if _, ok := c[f]; ok {
						c[f] = 0
					}
				}
			}
			zeroCounters(x)
		}
	case []any:
		for _, x := range v {
			zeroCounters(x)
		}
	}
}
