package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
)

// TestCLIUsage: usage --pull stores the node's records once and
// acknowledges them to the node at the next pull; the sums
// are per sandbox and per owner over the range asked.
func TestCLIUsage(t *testing.T) {
	e := newEnv(t)
	e.ok("key", "create", "--owner", "team-a")
	t0 := time.Now().Add(-time.Hour).UTC().Truncate(time.Second)
	for i := range 4 {
		id := "cli-sb"
		if i%2 == 1 {
			id = "other"
		}
		e.node.AddUsage(api.UsageRecord{SandboxID: id, Generation: 1, Start: t0.Add(time.Duration(i) * time.Minute), End: t0.Add(time.Duration(i+1) * time.Minute),
			Usage: api.Usage{CPUUsec: 2_000_000, TxBytes: 100, MemoryPeakBytes: uint64(1000 * (i + 1)), WallMS: 60_000}})
	}
	out := e.ok("usage", "--pull")
	if !strings.Contains(out, "cli-sb") || !strings.Contains(out, "other") || !strings.Contains(out, "4.000") {
		t.Fatalf("usage:\n%s", out)
	}
	// A pull acknowledges the cursor it starts from: nothing yet.
	if a := e.node.UsageAcked(); a != 0 {
		t.Fatalf("the node was acknowledged %d records before any was stored", a)
	}
	// Pulled again: nothing doubles.
	var sums struct {
		Sandboxes []struct {
			SandboxID string    `json:"sandbox_id"`
			Records   int       `json:"records"`
			Usage     api.Usage `json:"usage"`
		} `json:"sandboxes"`
	}
	js := e.ok("--json", "usage", "--pull", "--sandbox", "other")
	// The next pull acknowledged what the first stored (the node may drop it).
	if a := e.node.UsageAcked(); a != 4 {
		t.Fatalf("the node was acknowledged %d records, want 4", a)
	}
	if err := json.Unmarshal([]byte(js), &sums); err != nil {
		t.Fatal(err)
	}
	if len(sums.Sandboxes) != 1 || sums.Sandboxes[0].Records != 2 || sums.Sandboxes[0].Usage.CPUUsec != 4_000_000 || sums.Sandboxes[0].Usage.MemoryPeakBytes != 4000 {
		t.Fatalf("usage --sandbox other: %s", js)
	}
	// Only the last two minutes' records: one of each.
	js = e.ok("--json", "usage", "--since", t0.Add(2*time.Minute).Format(time.RFC3339))
	if err := json.Unmarshal([]byte(js), &sums); err != nil {
		t.Fatal(err)
	}
	if len(sums.Sandboxes) != 2 || sums.Sandboxes[0].Records != 1 || sums.Sandboxes[1].Records != 1 {
		t.Fatalf("usage --since: %s", js)
	}
	if r := e.run("", "usage", "--since", "yesterday"); r.code != exitUsage {
		t.Fatalf("usage --since yesterday: exit %d, %s", r.code, r.stderr)
	}
}
