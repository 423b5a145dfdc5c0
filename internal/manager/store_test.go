package manager

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time {
	c.t = c.t.Add(time.Second)
	return c.t
}

func openTestStore(t *testing.T) *Store {
	t.Helper()
	clk := &fakeClock{t: time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)}
	s, err := OpenStore(context.Background(), filepath.Join(t.TempDir(), "sub", "manager.db"), clk.now)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestStoreMigrationsAndPragmas(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "m.db")
	s, err := OpenStore(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := s.SchemaVersion(ctx); err != nil || v != len(migrations) {
		t.Fatalf("schema version = %d, %v; want %d", v, err, len(migrations))
	}
	var mode string
	var fk, busy int
	if err := s.db.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode); err != nil {
		t.Fatal(err)
	}
	if err := s.db.QueryRowContext(ctx, `PRAGMA foreign_keys`).Scan(&fk); err != nil {
		t.Fatal(err)
	}
	if err := s.db.QueryRowContext(ctx, `PRAGMA busy_timeout`).Scan(&busy); err != nil {
		t.Fatal(err)
	}
	if mode != "wal" || fk != 1 || busy < 1000 {
		t.Fatalf("journal_mode=%s foreign_keys=%d busy_timeout=%d; want wal, 1, >=1000", mode, fk, busy)
	}
	// Foreign keys are enforced: an operation needs its generation.
	_, err = s.db.ExecContext(ctx, `INSERT INTO operations (operation_id, kind, sandbox_id, generation, state, created_at) VALUES ('o', 'claim', 'nope', 1, 'pending', 'x')`)
	if err == nil {
		t.Fatal("operation without generation was accepted: foreign keys not enforced")
	}
	s.Close()

	// Reopening an up-to-date database changes nothing.
	s, err = OpenStore(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := s.SchemaVersion(ctx); v != len(migrations) {
		t.Fatalf("schema version after reopen = %d", v)
	}
	// A database from a newer binary is refused, not silently used.
	if _, err := s.db.ExecContext(ctx, `PRAGMA user_version = 99`); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := OpenStore(ctx, path, nil); err == nil {
		t.Fatal("opened a database with a newer schema")
	}
}

func TestStoreClaimLifecycle(t *testing.T) {
	ctx := context.Background()
	s := openTestStore(t)
	if _, err := s.PinNode(ctx, "node-1", "/s", nil); err != nil {
		t.Fatal(err)
	}
	in := ClaimIntent{SandboxID: "sb1", NodeID: "node-1", OperationID: "op-1",
		Resources: api.Resources{CPUMillis: 500, MemoryBytes: 256 << 20, PIDs: 64},
		RootFS:    api.RootFS{Mode: "overlay", Template: "busybox"}}
	op, reused, err := s.BeginClaim(ctx, in)
	if err != nil || reused {
		t.Fatalf("BeginClaim = %+v, %v, %v", op, reused, err)
	}
	if op.Generation != 1 || op.State != OpPending || op.Kind != KindClaim || op.OperationID != "op-1" {
		t.Fatalf("op = %+v", op)
	}

	// A second begin while the first is pending returns the same operation.
	in2 := in
	in2.OperationID = "op-2"
	op2, reused, err := s.BeginClaim(ctx, in2)
	if err != nil || !reused || op2.OperationID != "op-1" || op2.Generation != 1 {
		t.Fatalf("retry BeginClaim = %+v, reused=%v, %v", op2, reused, err)
	}

	sb := api.Sandbox{ID: "sb1", Generation: 1, State: api.StateReady, ContainerID: "c1", LeaseID: "l1",
		Resources: in.Resources, Timings: api.Timings{TotalMS: 42}}
	if err := s.FinishClaim(ctx, "op-1", sb); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Sandbox(ctx, "sb1")
	if err != nil || rec.State != api.StateReady || rec.Generation != 1 || rec.NodeID != "node-1" {
		t.Fatalf("sandbox = %+v, %v", rec, err)
	}
	gens, err := s.Generations(ctx, "sb1")
	if err != nil || len(gens) != 1 {
		t.Fatalf("generations = %+v, %v", gens, err)
	}
	g := gens[0]
	if g.ContainerID != "c1" || g.LeaseID != "l1" || g.Timings.TotalMS != 42 || g.Resources.MemoryBytes != 256<<20 || g.RootFS.Template != "busybox" {
		t.Fatalf("generation = %+v", g)
	}
	if o, _ := s.Operation(ctx, "op-1"); o.State != OpDone || o.FinishedAt == nil {
		t.Fatalf("operation after finish = %+v", o)
	}

	// A ready sandbox cannot be claimed again.
	in3 := in
	in3.OperationID = "op-3"
	if _, _, err := s.BeginClaim(ctx, in3); errdefs.CodeOf(err) != errdefs.CodeConflict {
		t.Fatalf("claim of a ready sandbox: %v, want conflict", err)
	}

	// Release: recorded, pending reused, finished with a proof.
	rop, reused, err := s.BeginRelease(ctx, "sb1", "rel-1")
	if err != nil || reused || rop.Generation != 1 || rop.Kind != KindRelease {
		t.Fatalf("BeginRelease = %+v, %v, %v", rop, reused, err)
	}
	if rec, _ := s.Sandbox(ctx, "sb1"); rec.State != api.StateReleasing {
		t.Fatalf("state during release = %s", rec.State)
	}
	if again, reused, err := s.BeginRelease(ctx, "sb1", "rel-2"); err != nil || !reused || again.OperationID != "rel-1" {
		t.Fatalf("retry BeginRelease = %+v, %v, %v", again, reused, err)
	}
	p := ProofRecord{Proof: api.CleanupProof{OperationID: "rel-1", SandboxID: "sb1", Generation: 1, Clean: true}, Verified: true}
	if err := s.FinishRelease(ctx, "rel-1", api.Sandbox{ID: "sb1", Generation: 1, State: api.StateReleased}, p); err != nil {
		t.Fatal(err)
	}
	pr, err := s.Proof(ctx, "rel-1")
	if err != nil || !pr.Verified || pr.SandboxID != "sb1" || pr.Generation != 1 || !pr.Proof.Clean {
		t.Fatalf("proof = %+v, %v", pr, err)
	}
	if _, _, err := s.BeginRelease(ctx, "sb1", "rel-3"); errdefs.CodeOf(err) != errdefs.CodeConflict {
		t.Fatalf("release of a released sandbox: %v, want conflict", err)
	}

	// The identity survives: the next claim is generation 2.
	in4 := in
	in4.OperationID = "op-4"
	op4, _, err := s.BeginClaim(ctx, in4)
	if err != nil || op4.Generation != 2 {
		t.Fatalf("next claim = %+v, %v; want generation 2", op4, err)
	}
	// A definitive failure fails the generation; the one after is 3.
	if err := s.FailOperation(ctx, "op-4", "capacity_exhausted: full"); err != nil {
		t.Fatal(err)
	}
	if rec, _ := s.Sandbox(ctx, "sb1"); rec.State != api.StateFailed || rec.Generation != 2 {
		t.Fatalf("after failed claim: %+v", rec)
	}
	if o, _ := s.Operation(ctx, "op-4"); o.State != OpFailed || o.Error != "capacity_exhausted: full" {
		t.Fatalf("failed op = %+v", o)
	}
	in5 := in
	in5.OperationID = "op-5"
	if op5, _, err := s.BeginClaim(ctx, in5); err != nil || op5.Generation != 3 {
		t.Fatalf("claim after failure = %+v, %v", op5, err)
	}
	ops, err := s.Operations(ctx, "sb1")
	if err != nil || len(ops) != 4 {
		t.Fatalf("operations = %d, %v; want 4", len(ops), err)
	}
	var got []string
	for _, o := range ops {
		got = append(got, o.OperationID)
	}
	if want := []string{"op-1", "rel-1", "op-4", "op-5"}; !equal(got, want) {
		t.Fatalf("operations order %v, want %v", got, want)
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestStoreReleaseFailureRestoresState(t *testing.T) {
	ctx := context.Background()
	s := openTestStore(t)
	if _, _, err := s.BeginClaim(ctx, ClaimIntent{SandboxID: "sb", OperationID: "c1"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.BeginRelease(ctx, "sb", "r0"); errdefs.CodeOf(err) != errdefs.CodeConflict {
		t.Fatalf("release while claim pending: %v, want conflict", err)
	}
	if err := s.FinishClaim(ctx, "c1", api.Sandbox{ID: "sb", Generation: 1, State: api.StateReady}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.BeginRelease(ctx, "sb", "r1"); err != nil {
		t.Fatal(err)
	}
	if err := s.FailOperation(ctx, "r1", "internal: boom"); err != nil {
		t.Fatal(err)
	}
	if rec, _ := s.Sandbox(ctx, "sb"); rec.State != api.StateReady {
		t.Fatalf("state after failed release = %s, want ready", rec.State)
	}
	if _, _, err := s.BeginRelease(ctx, "missing", "r2"); errdefs.CodeOf(err) != errdefs.CodeNotFound {
		t.Fatalf("release of unknown sandbox: %v, want not_found", err)
	}
}

func TestStorePinNodeTrustOnFirstUse(t *testing.T) {
	ctx := context.Background()
	s := openTestStore(t)
	r, err := s.PinNode(ctx, "n1", "/a.sock", nil)
	if err != nil || len(r.PublicKey) != 0 {
		t.Fatalf("first contact = %+v, %v", r, err)
	}
	r, err = s.PinNode(ctx, "n1", "/a.sock", []byte("key-one"))
	if err != nil || string(r.PublicKey) != "key-one" {
		t.Fatalf("pin = %+v, %v", r, err)
	}
	r, err = s.PinNode(ctx, "n1", "/b.sock", []byte("key-two"))
	if err != nil || string(r.PublicKey) != "key-one" || r.Socket != "/b.sock" {
		t.Fatalf("second key replaced the pinned one: %+v, %v", r, err)
	}
	if !r.LastSeen.After(r.FirstSeen) {
		t.Fatalf("last_seen %v not after first_seen %v", r.LastSeen, r.FirstSeen)
	}
	if _, err := s.Node(ctx, "n2"); errdefs.CodeOf(err) != errdefs.CodeNotFound {
		t.Fatalf("unknown node: %v", err)
	}
	nodes, err := s.Nodes(ctx)
	if err != nil || len(nodes) != 1 {
		t.Fatalf("nodes = %+v, %v", nodes, err)
	}
}

func TestStoreAdoptAndConcurrentOpen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "m.db")
	a, err := OpenStore(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := OpenStore(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := a.PinNode(ctx, "n", "/s", nil); err != nil {
		t.Fatal(err)
	}
	if err := a.AdoptSandbox(ctx, "n", api.Sandbox{ID: "orphan", Generation: 7, State: api.StateReady, LeaseID: "l7"}); err != nil {
		t.Fatal(err)
	}
	// The other handle (another CLI process) sees it.
	rec, err := b.Sandbox(ctx, "orphan")
	if err != nil || rec.Generation != 7 || rec.NodeID != "n" {
		t.Fatalf("adopted = %+v, %v", rec, err)
	}
	op, _, err := b.BeginRelease(ctx, "orphan", "r")
	if err != nil || op.Generation != 7 {
		t.Fatalf("release of adopted = %+v, %v", op, err)
	}
	var n int
	if err := a.db.QueryRowContext(ctx, `SELECT count(*) FROM operations WHERE state = 'pending'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("pending ops = %d, %v", n, err)
	}
}
