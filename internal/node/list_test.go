package node

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/journal"
)

// TestListWhileJournalGrows: List (GET /v1/sandboxes, which the fleet's
// node process polls) while commits grow the journal. List once added
// each sandbox's live facts inside its read transaction, and a released
// sandbox's usage is read in a read transaction of its own: nested in the
// first, it waits behind a commit that remaps the file, which waits for
// the first: ctld's journal hung (seen in the VM when a guest's exit was
// journaled during the node process's List).
func TestListWhileJournalGrows(t *testing.T) {
	tk, _ := fakeKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	j := r.n.d.Journal
	// Released sandboxes: their live usage comes from the journal.
	if err := j.Update(func(tx *journal.Tx) error {
		for i := range 200 {
			if err := tx.PutSandbox(journal.Sandbox{ID: fmt.Sprintf("gone-%03d", i), Generation: 1, State: journal.StateReleased}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		// Commits that grow the file (each a remap when it outgrows the
		// map), of records List does not read.
		for ctx.Err() == nil {
			if err := j.Update(func(tx *journal.Tx) error {
				for range 1000 {
					if _, err := tx.AppendUsage(journal.UsageRecord{SandboxID: "pad", Generation: 1}); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	lists := 0
	for ctx.Err() == nil {
		listed := make(chan error, 1)
		go func() { _, err := r.n.List(context.Background()); listed <- err }()
		select {
		case err := <-listed:
			if err != nil {
				t.Fatal(err)
			}
			lists++
		case <-time.After(3 * time.Second):
			cancel()
			t.Fatalf("List hung (after %d lists) while the journal grew", lists)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	t.Logf("%d lists while the journal grew", lists)
}
