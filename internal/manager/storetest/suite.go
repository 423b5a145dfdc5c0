// Package storetest is the contract of the manager's lifecycle store
// (sandboxes, generations, operations, proofs, nodes, heads): the same
// cases run against SQLite and PostgreSQL. The concurrent cases use two
// handles on one database, as two manager processes would.
package storetest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/manager"
)

// Opener opens a fresh, empty database and returns two handles on it
// (two processes' stores); recorded times come from now.
type Opener func(t *testing.T, now func() time.Time) (a, b *manager.Store)

// Run runs the whole contract against open's stores.
func Run(t *testing.T, open Opener) {
	for _, c := range []struct {
		name string
		fn   func(*testing.T, Opener)
	}{
		{"ClaimLifecycle", claimLifecycle},
		{"ReleaseFailureRestoresState", releaseFailureRestoresState},
		{"PinNodeTrustOnFirstUse", pinNodeTrustOnFirstUse},
		{"ConcurrentClaimsShareOneGeneration", concurrentClaims},
		{"ConcurrentReleasesShareOneOperation", concurrentReleases},
		{"HeadsOnlyMoveForward", headsOnlyMoveForward},
	} {
		t.Run(c.name, func(t *testing.T) { c.fn(t, open) })
	}
}

// Clock ticks a second at each reading, so records are ordered by time.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *Clock { return &Clock{t: time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)} }

func (c *Clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(time.Second)
	return c.t
}

func claimLifecycle(t *testing.T, open Opener) {
	ctx := context.Background()
	s, _ := open(t, newClock().now)
	if _, err := s.PinNode(ctx, "node-1", "/s", nil); err != nil {
		t.Fatal(err)
	}
	in := manager.ClaimIntent{SandboxID: "sb1", NodeID: "node-1", OperationID: "op-1",
		Resources: api.Resources{CPUMillis: 500, MemoryBytes: 256 << 20, PIDs: 64},
		RootFS:    api.RootFS{Mode: "overlay", Template: "busybox"}}
	op, reused, err := s.BeginClaim(ctx, in)
	if err != nil || reused {
		t.Fatalf("BeginClaim = %+v, %v, %v", op, reused, err)
	}
	if op.Generation != 1 || op.State != manager.OpPending || op.Kind != manager.KindClaim || op.OperationID != "op-1" {
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
	if o, _ := s.Operation(ctx, "op-1"); o.State != manager.OpDone || o.FinishedAt == nil {
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
	if err != nil || reused || rop.Generation != 1 || rop.Kind != manager.KindRelease {
		t.Fatalf("BeginRelease = %+v, %v, %v", rop, reused, err)
	}
	if rec, _ := s.Sandbox(ctx, "sb1"); rec.State != api.StateReleasing {
		t.Fatalf("state during release = %s", rec.State)
	}
	if again, reused, err := s.BeginRelease(ctx, "sb1", "rel-2"); err != nil || !reused || again.OperationID != "rel-1" {
		t.Fatalf("retry BeginRelease = %+v, %v, %v", again, reused, err)
	}
	p := manager.ProofRecord{Proof: api.CleanupProof{OperationID: "rel-1", SandboxID: "sb1", Generation: 1, Clean: true}, Verified: true}
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
	if o, _ := s.Operation(ctx, "op-4"); o.State != manager.OpFailed || o.Error != "capacity_exhausted: full" {
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

func releaseFailureRestoresState(t *testing.T, open Opener) {
	ctx := context.Background()
	s, _ := open(t, newClock().now)
	if _, _, err := s.BeginClaim(ctx, manager.ClaimIntent{SandboxID: "sb", OperationID: "c1"}); err != nil {
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

func pinNodeTrustOnFirstUse(t *testing.T, open Opener) {
	ctx := context.Background()
	s, _ := open(t, newClock().now)
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

// parallel runs n calls of fn, the even ones on a and the odd ones on b,
// all started together.
func parallel(n int, a, b *manager.Store, fn func(i int, s *manager.Store)) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		s := a
		if i%2 == 1 {
			s = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			fn(i, s)
		}()
	}
	close(start)
	wg.Wait()
}

// concurrentClaims: 40 creates of one sandbox from two handles record one
// claim of generation 1, which every caller gets (one new, the rest
// reused); after it settles, 40 more allocate exactly generation 2.
func concurrentClaims(t *testing.T, open Opener) {
	ctx := context.Background()
	clk := newClock()
	a, b := open(t, clk.now)
	for round, want := range []uint64{1, 2} {
		var mu sync.Mutex
		ops := map[string]uint64{}
		created := 0
		parallel(40, a, b, func(i int, s *manager.Store) {
			op, reused, err := s.BeginClaim(ctx, manager.ClaimIntent{SandboxID: "sb", OperationID: fmt.Sprintf("c%d-%d", round, i)})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("BeginClaim %d: %v", i, err)
				return
			}
			ops[op.OperationID] = op.Generation
			if !reused {
				created++
			}
		})
		if len(ops) != 1 || created != 1 {
			t.Fatalf("round %d: operations %v, %d created; want one, created once", round, ops, created)
		}
		for id, gen := range ops {
			if gen != want {
				t.Fatalf("round %d: generation %d, want %d", round, gen, want)
			}
			if err := a.FailOperation(ctx, id, "internal: settled by the test"); err != nil {
				t.Fatal(err)
			}
		}
	}
	gens, err := b.Generations(ctx, "sb")
	if err != nil || len(gens) != 2 {
		t.Fatalf("generations = %+v, %v; want 2", gens, err)
	}
}

// concurrentReleases: 40 destroys of one ready sandbox from two handles
// record one release; the sandbox is releasing, and once finished, a
// further destroy is a conflict.
func concurrentReleases(t *testing.T, open Opener) {
	ctx := context.Background()
	a, b := open(t, newClock().now)
	if _, _, err := a.BeginClaim(ctx, manager.ClaimIntent{SandboxID: "sb", OperationID: "c"}); err != nil {
		t.Fatal(err)
	}
	if err := a.FinishClaim(ctx, "c", api.Sandbox{ID: "sb", Generation: 1, State: api.StateReady}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	ops := map[string]bool{}
	parallel(40, a, b, func(i int, s *manager.Store) {
		op, _, err := s.BeginRelease(ctx, "sb", fmt.Sprintf("r%d", i))
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			t.Errorf("BeginRelease %d: %v", i, err)
			return
		}
		ops[op.OperationID] = true
	})
	if len(ops) != 1 {
		t.Fatalf("releases recorded: %v, want one", ops)
	}
	var id string
	for id = range ops {
	}
	p := manager.ProofRecord{Proof: api.CleanupProof{OperationID: id, SandboxID: "sb", Generation: 1, Clean: true}, Verified: true}
	if err := b.FinishRelease(ctx, id, api.Sandbox{ID: "sb", Generation: 1, State: api.StateReleased}, p); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.BeginRelease(ctx, "sb", "late"); errdefs.CodeOf(err) != errdefs.CodeConflict {
		t.Fatalf("release after the release: %v, want conflict", err)
	}
	if pr, err := a.Proof(ctx, id); err != nil || !pr.Verified {
		t.Fatalf("proof = %+v, %v", pr, err)
	}
}

// headsOnlyMoveForward: 100 publishes (seq 1..100, in any order, from two
// handles) while a reader watches: the head it sees never moves back and
// ends at 100. Then a newer writer epoch fences an older one, whatever
// its seq.
func headsOnlyMoveForward(t *testing.T, open Opener) {
	ctx := context.Background()
	a, b := open(t, newClock().now)
	if _, _, err := a.BeginClaim(ctx, manager.ClaimIntent{SandboxID: "sb", OperationID: "c"}); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	watched := make(chan error, 1)
	go func() {
		var last uint64
		for {
			h, err := b.Head(ctx, "sb")
			if err == nil && h.Seq < last {
				err = fmt.Errorf("head moved back from %d to %d", last, h.Seq)
			}
			if err != nil {
				watched <- err
				return
			}
			last = h.Seq
			select {
			case <-stop:
				watched <- nil
				return
			default:
			}
		}
	}()
	var mu sync.Mutex
	accepted := 0
	parallel(100, a, b, func(i int, s *manager.Store) {
		seq := uint64(100 - i)
		if i%3 == 0 {
			seq = uint64(i + 1)
		}
		err := s.PublishHead(ctx, "sb", api.VolumeHead{Seq: seq, Generation: seq, WriterEpoch: 1, Node: "n"})
		mu.Lock()
		defer mu.Unlock()
		switch errdefs.CodeOf(err) {
		case "":
			accepted++
		case errdefs.CodeFenced:
		default:
			t.Errorf("publish %d: %v", seq, err)
		}
	})
	close(stop)
	if err := <-watched; err != nil {
		t.Fatal(err)
	}
	if h, err := a.Head(ctx, "sb"); err != nil || h.Seq != 100 || accepted < 1 {
		t.Fatalf("head = %+v, %v (%d accepted); want seq 100", h, err, accepted)
	}
	if err := b.PublishHead(ctx, "sb", api.VolumeHead{Seq: 101, Generation: 101, WriterEpoch: 2, Node: "m"}); err != nil {
		t.Fatal(err)
	}
	if err := a.PublishHead(ctx, "sb", api.VolumeHead{Seq: 500, Generation: 500, WriterEpoch: 1, Node: "n"}); errdefs.CodeOf(err) != errdefs.CodeFenced {
		t.Fatalf("publish of an older writer epoch: %v, want fenced", err)
	}
	if h, _ := b.Head(ctx, "sb"); h.Seq != 101 || h.WriterEpoch != 2 || h.Node != "m" {
		t.Fatalf("head after the fenced publish = %+v", h)
	}
}
