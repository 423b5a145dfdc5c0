package servicestoretest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/manager"
)

// lifecycle is the part of the manager's store that runs a sandbox's
// generations (claim, release) under the service's records.
type lifecycle interface {
	claimer
	FinishClaim(ctx context.Context, opID string, sb api.Sandbox) error
	BeginRelease(ctx context.Context, id, newOpID string) (manager.OperationRecord, bool, error)
	FinishRelease(ctx context.Context, opID string, sb api.Sandbox, p manager.ProofRecord) error
}

// exitCandidates: the exit watch's pages reach every sandbox however many
// exited on_exit keep sandboxes came first: those are done with (not
// returned), an exited on_exit destroy one stays until it is ended, and
// the pages go on from a cursor. A recorded exit is its generation's: a
// resumed sandbox's next generation shows none and records its own.
func exitCandidates(t *testing.T, open Opener) {
	ctx := context.Background()
	s, _ := newStore(t, open)
	c, ok := s.(lifecycle)
	if !ok {
		t.Fatalf("%T does not run generations", s)
	}
	if _, err := s.CreateOwner(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	claim := func(id string, n int) {
		t.Helper()
		op := fmt.Sprintf("claim-%s-%d", id, n)
		if _, _, err := c.BeginClaim(ctx, manager.ClaimIntent{SandboxID: id, OperationID: op, Request: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
		if err := c.FinishClaim(ctx, op, api.Sandbox{ID: id, State: api.StateReady}); err != nil {
			t.Fatal(err)
		}
	}
	ids := []string{"sb-1", "sb-2", "sb-3", "sb-4", "sb-5"}
	for _, id := range ids {
		if err := s.AdmitCreate(ctx, manager.Admission{Owner: "t", ID: id, Spec: []byte("{}"), CPUMillis: 10, Memory: 1 << 20}); err != nil {
			t.Fatal(err)
		}
		claim(id, 1)
	}
	pages := func(limit int) []string {
		t.Helper()
		var out []string
		after := ""
		for range 10 {
			page, err := s.ExitCandidates(ctx, after, limit)
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range page {
				out = append(out, o.ID)
			}
			if len(page) < limit {
				return out
			}
			after = page[len(page)-1].ID
		}
		t.Fatalf("pages never ended: %v", out)
		return nil
	}
	if got := fmt.Sprint(pages(2)); got != fmt.Sprint(ids) {
		t.Fatalf("all ready: pages of 2 = %v, want %v", got, ids)
	}
	at := time.Date(2026, 12, 6, 8, 0, 1, 0, time.UTC)
	// sb-1 and sb-2 exited, keep: done with; sb-3 exited, destroy: stays.
	for id, destroy := range map[string]bool{"sb-1": false, "sb-2": false, "sb-3": true} {
		first, err := s.RecordExit(ctx, id, 1, manager.SandboxExit{Kind: api.ExitNormal, Code: 1, At: at}, destroy)
		if err != nil || !first {
			t.Fatalf("record exit of %s: %v, %v; want the first", id, first, err)
		}
		if first, err := s.RecordExit(ctx, id, 1, manager.SandboxExit{Kind: api.ExitNormal, Code: 9, At: at}, destroy); err != nil || first {
			t.Fatalf("record exit of %s again: %v, %v; want not the first", id, first, err)
		}
	}
	page, err := s.ExitCandidates(ctx, "", 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(page) != 2 || page[0].ID != "sb-3" || page[0].Exit == nil || page[0].Exit.Code != 1 || page[1].ID != "sb-4" {
		t.Fatalf("first page after the exits: %+v, want sb-3 (exited, to destroy, code 1) and sb-4", page)
	}
	if got, want := fmt.Sprint(pages(1)), "[sb-3 sb-4 sb-5]"; got != want {
		t.Fatalf("pages of 1 after the exits = %v, want %v", got, want)
	}
	if err := s.EndOwnedSandbox(ctx, "sb-3", "exited: code 1"); err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(pages(5)), "[sb-4 sb-5]"; got != want {
		t.Fatalf("after sb-3's destroy: %v, want %v", got, want)
	}

	// sb-1 resumed: released, then its generation 2 claimed.
	rel, _, err := c.BeginRelease(ctx, "sb-1", "release-sb-1")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.FinishRelease(ctx, rel.OperationID, api.Sandbox{ID: "sb-1", Generation: 1, State: api.StateReleased},
		manager.ProofRecord{OperationID: rel.OperationID, SandboxID: "sb-1", Generation: 1}); err != nil {
		t.Fatal(err)
	}
	claim("sb-1", 2)
	o, err := s.OwnedSandbox(ctx, "t", "sb-1")
	if err != nil || o.Generation != 2 || o.Exit != nil {
		t.Fatalf("resumed sb-1: generation %d exit %+v, %v; want generation 2 without an exit", o.Generation, o.Exit, err)
	}
	if got, want := fmt.Sprint(pages(5)), "[sb-1 sb-4 sb-5]"; got != want {
		t.Fatalf("after sb-1's resume: %v, want %v", got, want)
	}
	if first, err := s.RecordExit(ctx, "sb-1", 2, manager.SandboxExit{Kind: api.ExitNormal, Code: 2, At: at}, false); err != nil || !first {
		t.Fatalf("record the exit of sb-1's generation 2: %v, %v; want the first", first, err)
	}
	if o, err := s.OwnedSandbox(ctx, "t", "sb-1"); err != nil || o.Exit == nil || o.Exit.Code != 2 || o.State != string(api.StateExited) {
		t.Fatalf("sb-1 after its generation 2 exited: %s exit %+v, %v; want exited code 2", o.State, o.Exit, err)
	}
}
