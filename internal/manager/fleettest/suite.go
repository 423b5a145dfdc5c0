// Package fleettest is the contract of the fleet's part of the manager's
// store (registered nodes, heartbeats, lost nodes, placement and its
// capacity reservations): the same cases run against SQLite and
// PostgreSQL. The concurrent cases use two handles on one database, as
// two manager replicas would.
package fleettest

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/manager"
	"github.com/ctld/ctld/internal/proof"
)

// Opener opens a fresh, empty database and returns two handles on it;
// recorded times come from now.
type Opener func(t *testing.T, now func() time.Time) (a, b *manager.Store)

// Run runs the whole contract against open's stores.
func Run(t *testing.T, open Opener) {
	for _, c := range []struct {
		name string
		fn   func(*testing.T, Opener)
	}{
		{"RegisterPinsTheKey", registerPinsTheKey},
		{"HeartbeatCordonAndLost", heartbeatCordonAndLost},
		{"PlacementChoosesANode", placementChoosesANode},
		{"PlacementCountsTheWarmPool", placementCountsWarm},
		{"ReservationNeedsAVerifiedCleanProof", reservationNeedsAVerifiedCleanProof},
		{"ConcurrentPlacementsNeverOvercommit", concurrentPlacements},
		{"ConcurrentPlacementsDoNotAbort", concurrentPlacementsDoNotAbort},
		{"ConcurrentCreatesOfOneSandbox", concurrentCreatesOfOneSandbox},
		{"LostBlockTakenOver", lostBlockTakenOver},
		{"TakeoverFencesANeverPublishedHead", takeoverFencesNeverPublished},
		{"RefusedStaleReleaseKeepsTheNewGeneration", refusedStaleReleaseKeepsNew},
		{"LostBlockReadoptedOnlyWhereItIsPlaced", lostBlockReadopted},
		{"PlacedExitsAndEgress", placedExitsAndEgress},
		{"NodeSandboxesForDrain", nodeSandboxesForDrain},
	} {
		t.Run(c.name, func(t *testing.T) { c.fn(t, open) })
	}
}

// Clock is a settable clock: it moves only when the test says.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *Clock { return &Clock{t: time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC)} }

func (c *Clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *Clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// node is a test node: its identity signs proofs.
type node struct {
	id  string
	key ed25519.PrivateKey
}

func newNode(id string) node {
	_, k, err := ed25519.GenerateKey(nil)
	if err != nil {
		panic(err)
	}
	return node{id, k}
}

func (n node) pub() []byte { return n.key.Public().(ed25519.PublicKey) }

func (n node) reg(alloc manager.NodeAlloc, modes []string, templates ...string) manager.Registration {
	return manager.Registration{NodeID: n.id, Name: n.id + ".example", PublicKey: n.pub(), Allocatable: alloc,
		RunscVersion: "release-20221219.0", Platform: "systrap", RootModes: modes, Templates: templates, TTL: 10 * time.Second}
}

// proofOf is n's signed proof of a release; unclean names failing checks.
func (n node) proofOf(opID, sandbox string, gen uint64, unclean ...string) api.CleanupProof {
	p := proof.Proof{OperationID: opID, NodeID: n.id, BootID: "boot", Epoch: 1, SandboxID: sandbox, Generation: gen, Clean: true,
		Time: time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC)}
	for _, c := range []string{"cgroup_removed", "container_absent", "mounts_absent"} {
		ok := true
		for _, u := range unclean {
			if u == c {
				ok, p.Clean = false, false
			}
		}
		p.Checks = append(p.Checks, proof.Check{Name: c, OK: ok})
	}
	if err := proof.Sign(proof.Identity{NodeID: n.id, BootID: "boot", Key: n.key}, &p); err != nil {
		panic(err)
	}
	return api.CleanupProofOf(p)
}

var both = []string{"overlay", "block"}

func small() manager.NodeAlloc {
	return manager.NodeAlloc{CPUMillis: 2000, MemoryBytes: 2 << 30, DiskBytes: 8 << 30, Sandboxes: 4}
}

func spec(cpu int64, mode api.RootFSMode, template string) manager.Spec {
	return manager.Spec{Resources: api.Resources{CPUMillis: cpu, MemoryBytes: 256 << 20, PIDs: 64},
		RootFS: api.RootFS{Mode: mode, Template: template}}
}

// must(f())(t) is f's value, or the test's end with f's error.
func must[T any](v T, err error) func(t *testing.T) T {
	return func(t *testing.T) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func registerPinsTheKey(t *testing.T, open Opener) {
	ctx := context.Background()
	s, _ := open(t, newClock().now)
	n1 := newNode("n1")
	got := must(s.RegisterNode(ctx, n1.reg(small(), both, "busybox")))(t)
	if got.State != manager.NodeReady || string(got.PublicKey) != string(n1.pub()) || got.Allocatable != small() ||
		got.Platform != "systrap" || strings.Join(got.RootModes, ",") != "overlay,block" || strings.Join(got.Templates, ",") != "busybox" ||
		time.Duration(got.TTL) != 10*time.Second || got.HeartbeatAt.IsZero() {
		t.Fatalf("registered = %+v", got)
	}
	// The same key again updates what the node says of itself.
	r := n1.reg(manager.NodeAlloc{CPUMillis: 4000, MemoryBytes: 4 << 30, DiskBytes: 1 << 30, Sandboxes: 8}, []string{"overlay"})
	if got = must(s.RegisterNode(ctx, r))(t); got.Allocatable.CPUMillis != 4000 || len(got.Templates) != 0 {
		t.Fatalf("re-registered = %+v", got)
	}
	// Another key for the same id is refused and changes nothing.
	impostor := newNode("n1")
	if _, err := s.RegisterNode(ctx, impostor.reg(small(), both)); errdefs.CodeOf(err) != errdefs.CodeFenced {
		t.Fatalf("register with another key: %v, want fenced", err)
	}
	if got = must(s.FleetNode(ctx, "n1"))(t); string(got.PublicKey) != string(n1.pub()) || got.Allocatable.CPUMillis != 4000 {
		t.Fatalf("after the refused registration: %+v", got)
	}
	// A node first contacted directly (the single-node manager) keeps the
	// key it pinned then: registering with another is refused too.
	n2 := newNode("n2")
	if _, err := s.PinNode(ctx, "n2", "/run/ctld/ctld.sock", n2.pub()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.FleetNode(ctx, "n2"); errdefs.CodeOf(err) != errdefs.CodeNotFound {
		t.Fatalf("a contacted node is not registered: %v", err)
	}
	if _, err := s.RegisterNode(ctx, newNode("n2").reg(small(), both)); errdefs.CodeOf(err) != errdefs.CodeFenced {
		t.Fatalf("register over a contact-pinned key: %v, want fenced", err)
	}
	must(s.RegisterNode(ctx, n2.reg(small(), both)))(t)
	// Bad registrations are invalid_argument.
	for name, bad := range map[string]func(r *manager.Registration){
		"short key":    func(r *manager.Registration) { r.PublicKey = r.PublicKey[:5] },
		"negative cpu": func(r *manager.Registration) { r.Allocatable.CPUMillis = -1 },
		"no ttl":       func(r *manager.Registration) { r.TTL = 0 },
		"bad mode":     func(r *manager.Registration) { r.RootModes = []string{"tmpfs"} },
		"bad id":       func(r *manager.Registration) { r.NodeID = "../x" },
		"bad template": func(r *manager.Registration) { r.Templates = []string{"a b"} },
		"many":         func(r *manager.Registration) { r.Templates = make([]string, 300) },
	} {
		r := newNode("n3").reg(small(), both)
		bad(&r)
		if _, err := s.RegisterNode(ctx, r); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
			t.Errorf("%s: %v, want invalid_argument", name, err)
		}
	}
	nodes := must(s.FleetNodes(ctx))(t)
	if len(nodes) != 2 || nodes[0].NodeID != "n1" || nodes[1].NodeID != "n2" {
		t.Fatalf("nodes = %+v", nodes)
	}
}

func heartbeatCordonAndLost(t *testing.T, open Opener) {
	ctx := context.Background()
	clk := newClock()
	s, b := open(t, clk.now)
	n1, n2 := newNode("n1"), newNode("n2")
	must(s.RegisterNode(ctx, n1.reg(small(), both, "busybox")))(t)
	must(s.RegisterNode(ctx, n2.reg(small(), both, "busybox")))(t)
	// Place an overlay and a block sandbox on each node (spreading puts
	// them two and two), and a pending claim on n1.
	onNode := map[string][]string{}
	for i, m := range []api.RootFSMode{api.RootFSOverlay, api.RootFSOverlay, api.RootFSBlock, api.RootFSBlock} {
		id := fmt.Sprintf("sb%d", i)
		p := must(s.Place(ctx, manager.PlaceIntent{SandboxID: id, OperationID: "c-" + id, Spec: spec(100, m, "busybox")}))(t)
		onNode[p.NodeID] = append(onNode[p.NodeID], id)
		if err := s.FinishClaim(ctx, p.Operation.OperationID, api.Sandbox{ID: id, Generation: 1, State: api.StateReady}); err != nil {
			t.Fatal(err)
		}
	}
	if len(onNode["n1"]) != 2 || len(onNode["n2"]) != 2 {
		t.Fatalf("placements %v, want two on each node", onNode)
	}
	pend := must(s.Place(ctx, manager.PlaceIntent{SandboxID: "sbp", OperationID: "c-sbp", Spec: spec(100, api.RootFSOverlay, "busybox")}))(t)

	// Within TTL + grace nothing is lost; n2 keeps heartbeating.
	clk.add(12 * time.Second)
	must(s.Heartbeat(ctx, "n2"))(t)
	if lost := must(s.MarkLostNodes(ctx, 5*time.Second))(t); len(lost) != 0 {
		t.Fatalf("lost within the grace: %+v", lost)
	}
	clk.add(4 * time.Second) // n1: 16s since its heartbeat > 10s TTL + 5s grace
	lost := must(b.MarkLostNodes(ctx, 5*time.Second))(t)
	if len(lost) != 1 || lost[0].NodeID != "n1" {
		t.Fatalf("lost = %+v, want n1 only", lost)
	}
	n := must(s.FleetNode(ctx, "n1"))(t)
	if n.State != manager.NodeLost || !strings.Contains(n.Reason, "no heartbeat") {
		t.Fatalf("n1 = %+v", n)
	}
	// Its overlay sandboxes (and the pending claim) failed with the
	// reason; its block sandbox is lost; n2's are untouched.
	wantFailed := 1
	if pend.NodeID == "n1" {
		wantFailed++
	}
	if len(lost[0].Failed) != wantFailed || len(lost[0].Lost) != 1 {
		t.Fatalf("lost n1 failed %v, lost %v", lost[0].Failed, lost[0].Lost)
	}
	for _, id := range onNode["n1"] {
		rec := must(s.Sandbox(ctx, id))(t)
		gens := must(s.Generations(ctx, id))(t)
		want := api.StateFailed
		if gens[0].RootFS.Mode == api.RootFSBlock {
			want = api.StateLost
		}
		if rec.State != want || gens[0].State != want {
			t.Fatalf("%s on the lost node: %s (generation %s), want %s", id, rec.State, gens[0].State, want)
		}
		if r := must(s.SandboxReason(ctx, id))(t); !strings.Contains(r, "node n1 lost") {
			t.Fatalf("%s reason %q", id, r)
		}
	}
	if pend.NodeID == "n1" {
		if op := must(s.Operation(ctx, "c-sbp"))(t); op.State != manager.OpFailed || !strings.Contains(op.Error, "lost") {
			t.Fatalf("pending claim on the lost node: %+v", op)
		}
	}
	for _, id := range onNode["n2"] {
		if rec := must(s.Sandbox(ctx, id))(t); rec.State != api.StateReady {
			t.Fatalf("%s on the live node: %s", id, rec.State)
		}
	}
	// The lost node keeps its reservations until its proofs come back.
	if n.Reserved.Sandboxes < 2 {
		t.Fatalf("lost node's reservations were dropped: %+v", n.Reserved)
	}
	// What the database failed on n1 is what its ctld must release when it
	// comes back (its block sandbox, lost, is not among them).
	var abandoned []string
	for _, r := range must(s.Abandoned(ctx, "n1"))(t) {
		abandoned = append(abandoned, r.ID)
	}
	if strings.Join(abandoned, ",") != strings.Join(lost[0].Failed, ",") {
		t.Fatalf("abandoned on n1: %v, want the failed %v", abandoned, lost[0].Failed)
	}
	// Idempotent: marking again changes nothing.
	if again := must(s.MarkLostNodes(ctx, 5*time.Second))(t); len(again) != 0 {
		t.Fatalf("second mark: %+v", again)
	}
	// A lost node's heartbeat is fenced and it cannot be uncordoned; it
	// comes back by registering (with its pinned key).
	if _, err := s.Heartbeat(ctx, "n1"); errdefs.CodeOf(err) != errdefs.CodeFenced {
		t.Fatalf("heartbeat of a lost node: %v, want fenced", err)
	}
	if _, err := s.SetNodeState(ctx, "n1", manager.NodeReady); errdefs.CodeOf(err) != errdefs.CodeConflict {
		t.Fatalf("uncordon of a lost node: %v, want conflict", err)
	}
	// (Bigger now: its lost sandboxes still hold their reservations.)
	big := manager.NodeAlloc{CPUMillis: 8000, MemoryBytes: 8 << 30, DiskBytes: 8 << 30, Sandboxes: 16}
	if n := must(s.RegisterNode(ctx, n1.reg(big, both)))(t); n.State != manager.NodeReady {
		t.Fatalf("re-registered lost node: %+v", n)
	}
	if _, err := s.Heartbeat(ctx, "nope"); errdefs.CodeOf(err) != errdefs.CodeNotFound {
		t.Fatalf("heartbeat of an unknown node: %v", err)
	}

	// Cordon: no placement on it; uncordon brings it back. A cordoned
	// node that registers again stays cordoned.
	must(s.SetNodeState(ctx, "n2", manager.NodeCordoned))(t)
	must(s.RegisterNode(ctx, n2.reg(small(), both, "busybox")))(t)
	for i := range 3 {
		p := must(s.Place(ctx, manager.PlaceIntent{SandboxID: fmt.Sprintf("c%d", i), OperationID: fmt.Sprintf("cc%d", i), Spec: spec(100, api.RootFSBlock, "")}))(t)
		if p.NodeID != "n1" {
			t.Fatalf("placed on %s while n2 is cordoned", p.NodeID)
		}
	}
	if _, err := s.SetNodeState(ctx, "n2", "lost"); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
		t.Fatalf("set state lost by hand: %v", err)
	}
	must(s.SetNodeState(ctx, "n2", manager.NodeReady))(t)
	must(s.SetNodeState(ctx, "n1", manager.NodeDraining))(t)
	if p := must(s.Place(ctx, manager.PlaceIntent{SandboxID: "u", OperationID: "cu", Spec: spec(100, api.RootFSBlock, "")}))(t); p.NodeID != "n2" {
		t.Fatalf("after uncordon of n2 and drain of n1 placed on %s, want n2", p.NodeID)
	}
}

func placementChoosesANode(t *testing.T, open Opener) {
	ctx := context.Background()
	clk := newClock()
	s, _ := open(t, clk.now)
	if _, err := s.Place(ctx, manager.PlaceIntent{SandboxID: "x", OperationID: "cx", Spec: spec(100, "", "")}); errdefs.CodeOf(err) != errdefs.CodeCapacityExhausted {
		t.Fatalf("place with no nodes: %v, want capacity_exhausted", err)
	}
	a, bn, c := newNode("a"), newNode("b"), newNode("c")
	must(s.RegisterNode(ctx, a.reg(small(), []string{"overlay"}, "busybox")))(t)
	must(s.RegisterNode(ctx, bn.reg(small(), both, "debian")))(t)
	must(s.RegisterNode(ctx, c.reg(small(), both)))(t)
	place := func(id string, sp manager.Spec) (manager.Placement, error) {
		return s.Place(ctx, manager.PlaceIntent{SandboxID: id, OperationID: "op-" + id, Spec: sp})
	}
	// Block mode: only b and c; b holds debian and wins with its bonus
	// until it is a quarter fuller than c.
	var got []string
	for i := range 4 {
		p := must(place(fmt.Sprintf("blk%d", i), spec(500, api.RootFSBlock, "debian")))(t)
		got = append(got, p.NodeID)
	}
	if strings.Join(got, ",") != "b,b,c,b" {
		t.Fatalf("block placements %v, want b,b,c,b (template preferred, then spread)", got)
	}
	// Overlay of busybox: only a holds it.
	if p := must(place("ov", spec(100, api.RootFSOverlay, "busybox")))(t); p.NodeID != "a" {
		t.Fatalf("overlay busybox on %s, want a", p.NodeID)
	}
	// Overlay without a template: spread to the least loaded (a has one of
	// four sandboxes, c one of four at 500 cpu: a is lighter).
	if p := must(place("ov2", spec(100, api.RootFSOverlay, "")))(t); p.NodeID != "a" {
		t.Fatalf("overlay on %s, want a", p.NodeID)
	}
	// An overlay template no node holds; a claim bigger than any node.
	_, err := place("nope", spec(100, api.RootFSOverlay, "alpine"))
	if errdefs.CodeOf(err) != errdefs.CodeCapacityExhausted || !strings.Contains(err.Error(), "no template alpine") {
		t.Fatalf("overlay of a template no node holds: %v", err)
	}
	if _, err := place("huge", spec(5000, api.RootFSBlock, "")); errdefs.CodeOf(err) != errdefs.CodeCapacityExhausted || !strings.Contains(err.Error(), "full") {
		t.Fatalf("claim bigger than any node: %v", err)
	}
	// A retry of a pending create returns its placement, reserving nothing
	// more; a live sandbox cannot be placed again.
	before := must(s.FleetNode(ctx, "b"))(t).Reserved
	p := must(place("blk0", spec(500, api.RootFSBlock, "debian")))(t)
	if !p.Reused || p.NodeID != "b" || p.Operation.OperationID != "op-blk0" || must(s.FleetNode(ctx, "b"))(t).Reserved != before {
		t.Fatalf("retry = %+v", p)
	}
	if err := s.FinishClaim(ctx, "op-blk0", api.Sandbox{ID: "blk0", Generation: 1, State: api.StateReady}); err != nil {
		t.Fatal(err)
	}
	if _, err := place("blk0", spec(500, api.RootFSBlock, "")); errdefs.CodeOf(err) != errdefs.CodeConflict {
		t.Fatalf("place a ready sandbox: %v, want conflict", err)
	}
	// The node's work is its pending claims, with the spec to send.
	work := must(s.NodeWork(ctx, "b"))(t)
	if len(work) != 2 || work[0].Kind != manager.KindClaim {
		t.Fatalf("work of b = %+v", work)
	}
	req := must(manager.ClaimRequestOf(work[0]))(t)
	if req.OperationID != work[0].OperationID || req.Generation != 1 || req.Resources.CPUMillis != 500 || req.RootFS.Template != "debian" {
		t.Fatalf("claim request = %+v", req)
	}
	// A node whose heartbeat expired takes nothing, even before it is lost.
	clk.add(11 * time.Second)
	must(s.Heartbeat(ctx, "c"))(t)
	if p := must(place("late", spec(100, api.RootFSBlock, "debian")))(t); p.NodeID != "c" {
		t.Fatalf("placed on %s with only c's heartbeat alive", p.NodeID)
	}
}

func reservationNeedsAVerifiedCleanProof(t *testing.T, open Opener) {
	ctx := context.Background()
	s, _ := open(t, newClock().now)
	n := newNode("n")
	must(s.RegisterNode(ctx, n.reg(small(), both)))(t)
	ready := func(id string) manager.OperationRecord {
		p := must(s.Place(ctx, manager.PlaceIntent{SandboxID: id, OperationID: "c-" + id, Spec: spec(500, api.RootFSOverlay, "")}))(t)
		if err := s.FinishClaim(ctx, p.Operation.OperationID, api.Sandbox{ID: id, Generation: 1, State: api.StateReady}); err != nil {
			t.Fatal(err)
		}
		op, _ := must2(s.BeginRelease(ctx, id, "r-"+id))(t)
		return op
	}
	reserved := func() int64 { return must(s.FleetNode(ctx, "n"))(t).Reserved.Sandboxes }
	forger := newNode("n")
	cases := []struct {
		id       string
		proof    func(op manager.OperationRecord) api.CleanupProof
		verified bool
		returned bool
		reason   string
	}{
		{"forged", func(op manager.OperationRecord) api.CleanupProof {
			return forger.proofOf(op.OperationID, op.SandboxID, 1)
		}, false, false, "pinned key"},
		{"tampered", func(op manager.OperationRecord) api.CleanupProof {
			p := n.proofOf(op.OperationID, op.SandboxID, 1, "mounts_absent")
			p.Clean, p.Checks[2].OK = true, true // claims clean after signing
			return p
		}, false, false, "pinned key"},
		{"other-op", func(op manager.OperationRecord) api.CleanupProof { return n.proofOf("r-elsewhere", op.SandboxID, 1) }, false, false, "operation"},
		{"unclean", func(op manager.OperationRecord) api.CleanupProof {
			return n.proofOf(op.OperationID, op.SandboxID, 1, "mounts_absent")
		}, true, false, "mounts_absent"},
	}
	for _, c := range cases {
		op := ready(c.id)
		before := reserved()
		rec := must(s.FinishPlacedRelease(ctx, op.OperationID, api.Sandbox{ID: c.id, Generation: 1, State: api.StateReleased}, c.proof(op)))(t)
		if rec.Verified != c.verified || !strings.Contains(rec.VerifyError, c.reason) {
			t.Fatalf("%s: record %+v, want verified=%v with %q", c.id, rec, c.verified, c.reason)
		}
		if after := reserved(); after != before {
			t.Fatalf("%s: reserved sandboxes %d -> %d: capacity came back without a verified clean proof", c.id, before, after)
		}
		if stored := must(s.Proof(ctx, op.OperationID))(t); stored.Verified != c.verified || stored.VerifyError != rec.VerifyError {
			t.Fatalf("%s: stored proof %+v", c.id, stored)
		}
	}
	// The node is full now (four held); a verified clean proof returns one.
	if _, err := s.Place(ctx, manager.PlaceIntent{SandboxID: "more", OperationID: "c-more", Spec: spec(100, "", "")}); errdefs.CodeOf(err) != errdefs.CodeCapacityExhausted {
		t.Fatalf("place on a node full of held reservations: %v", err)
	}
	must(s.RegisterNode(ctx, n.reg(manager.NodeAlloc{CPUMillis: 4000, MemoryBytes: 4 << 30, DiskBytes: 8 << 30, Sandboxes: 5}, both)))(t)
	op := ready("good")
	before := reserved()
	rec := must(s.FinishPlacedRelease(ctx, op.OperationID, api.Sandbox{ID: "good", Generation: 1, State: api.StateReleased}, n.proofOf(op.OperationID, "good", 1)))(t)
	if !rec.Verified || rec.VerifyError != "" || reserved() != before-1 {
		t.Fatalf("clean proof: %+v, reserved %d -> %d", rec, before, reserved())
	}
	// A repeat (the answer was lost) returns the stored record and
	// returns nothing twice.
	again := must(s.FinishPlacedRelease(ctx, op.OperationID, api.Sandbox{}, forger.proofOf(op.OperationID, "good", 1)))(t)
	if !again.Verified || again.VerifyError != "" || reserved() != before-1 {
		t.Fatalf("repeat: %+v", again)
	}
	res := must(s.Reservations(ctx, "n"))(t)
	returned := 0
	for _, r := range res {
		if r.ReleasedAt != nil {
			returned++
			if r.SandboxID != "good" || r.ReleaseOperation != op.OperationID {
				t.Fatalf("returned reservation %+v", r)
			}
		}
	}
	if returned != 1 {
		t.Fatalf("%d reservations returned, want 1: %+v", returned, res)
	}
	// A claim the node refused returns its reservation at once.
	p := must(s.Place(ctx, manager.PlaceIntent{SandboxID: "refused", OperationID: "c-refused", Spec: spec(100, "", "")}))(t)
	before = reserved()
	if err := s.FailPlacedClaim(ctx, p.Operation.OperationID, "invalid_argument: no such template"); err != nil {
		t.Fatal(err)
	}
	if reserved() != before-1 {
		t.Fatalf("refused claim kept its reservation")
	}
	if rec := must(s.Sandbox(ctx, "refused"))(t); rec.State != api.StateFailed {
		t.Fatalf("refused claim's sandbox %+v", rec)
	}
	if err := s.FailPlacedClaim(ctx, p.Operation.OperationID, "again"); errdefs.CodeOf(err) != errdefs.CodeConflict {
		t.Fatalf("fail a finished claim: %v", err)
	}
}

func must2[A, B any](a A, b B, err error) func(t *testing.T) (A, B) {
	return func(t *testing.T) (A, B) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return a, b
	}
}

// concurrentPlacements: creates from many goroutines over two handles
// against three small nodes (four sandboxes of 500 millis each) place
// exactly what fits; a sampler reading the database the whole time never
// sees a node's active reservations above its allocatable, nor does the
// end state summed from the reservation rows. Then releases with verified
// proofs return room that a second wave fills exactly.
func concurrentPlacements(t *testing.T, open Opener) {
	ctx := context.Background()
	a, b := open(t, newClock().now)
	nodes := []node{newNode("n1"), newNode("n2"), newNode("n3")}
	for _, n := range nodes {
		must(a.RegisterNode(ctx, n.reg(small(), both)))(t)
	}
	byID := map[string]node{}
	for _, n := range nodes {
		byID[n.id] = n
	}
	stop := make(chan struct{})
	var samples, over atomic.Int64
	sampled := make(chan struct{})
	// Stopped before the test returns, however it returns.
	stopSampler := sync.OnceFunc(func() { close(stop); <-sampled })
	defer stopSampler()
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			default:
			}
			ns, err := a.FleetNodes(ctx)
			if err != nil {
				continue // a conflict or a busy database: sample again
			}
			samples.Add(1)
			for _, n := range ns {
				if !n.Reserved.Fits(n.Allocatable) {
					over.Add(1)
					t.Errorf("node %s reserved %+v over its allocatable %+v", n.NodeID, n.Reserved, n.Allocatable)
				}
			}
		}
	}()
	wave := func(round, creates int) (placed map[string]string, exhausted int) {
		var mu sync.Mutex
		placed = map[string]string{}
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range creates {
			s := a
			if i%2 == 1 {
				s = b
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				id := fmt.Sprintf("w%d-%d", round, i)
				for {
					p, err := s.Place(ctx, manager.PlaceIntent{SandboxID: id, OperationID: "c-" + id, Spec: spec(500, api.RootFSOverlay, "")})
					mu.Lock()
					switch {
					case err == nil:
						placed[id] = p.NodeID
					case errdefs.CodeOf(err) == errdefs.CodeCapacityExhausted:
						exhausted++
					case errdefs.RetryAfterOf(err) > 0:
						mu.Unlock()
						continue // contention past the store's own reruns: the caller's retry
					default:
						t.Errorf("place %s: %v", id, err)
					}
					mu.Unlock()
					return
				}
			}()
		}
		close(start)
		wg.Wait()
		return placed, exhausted
	}
	check := func(when string) map[string]int64 {
		held := map[string]int64{}
		for _, n := range nodes {
			var sum manager.NodeAlloc
			for _, r := range must(b.Reservations(ctx, n.id))(t) {
				if r.ReleasedAt == nil {
					sum.CPUMillis += r.Resources.CPUMillis
					sum.MemoryBytes += r.Resources.MemoryBytes
					sum.Sandboxes++
				}
			}
			if !sum.Fits(small()) {
				t.Fatalf("%s: node %s holds %+v, over %+v", when, n.id, sum, small())
			}
			// The node's running sum, which placement reads, is the rows'.
			if got := must(b.FleetNode(ctx, n.id))(t).Reserved; got != sum {
				t.Fatalf("%s: node %s's reserved sum %+v, its active reservations %+v", when, n.id, got, sum)
			}
			held[n.id] = sum.Sandboxes
		}
		return held
	}

	const creates = 30
	placed, exhausted := wave(1, creates)
	if len(placed) != 12 || exhausted != creates-12 {
		t.Fatalf("wave 1: %d placed, %d exhausted; want 12 and %d", len(placed), exhausted, creates-12)
	}
	if held := check("after wave 1"); held["n1"] != 4 || held["n2"] != 4 || held["n3"] != 4 {
		t.Fatalf("after wave 1 held %v, want 4 on each node", held)
	}
	// Release two on each node with clean proofs from that node.
	freed := map[string]int{}
	for id, nodeID := range placed {
		if freed[nodeID] == 2 {
			continue
		}
		freed[nodeID]++
		if err := a.FinishClaim(ctx, "c-"+id, api.Sandbox{ID: id, Generation: 1, State: api.StateReady}); err != nil {
			t.Fatal(err)
		}
		op, _ := must2(b.BeginRelease(ctx, id, "r-"+id))(t)
		rec := must(a.FinishPlacedRelease(ctx, op.OperationID, api.Sandbox{ID: id, Generation: 1, State: api.StateReleased}, byID[nodeID].proofOf(op.OperationID, id, 1)))(t)
		if !rec.Verified || rec.VerifyError != "" {
			t.Fatalf("release of %s: %+v", id, rec)
		}
	}
	placed2, exhausted2 := wave(2, creates)
	stopSampler()
	if len(placed2) != 6 || exhausted2 != creates-6 {
		t.Fatalf("wave 2: %d placed, %d exhausted; want 6 and %d", len(placed2), exhausted2, creates-6)
	}
	if held := check("after wave 2"); held["n1"] != 4 || held["n2"] != 4 || held["n3"] != 4 {
		t.Fatalf("after wave 2 held %v, want 4 on each node", held)
	}
	if samples.Load() == 0 || over.Load() != 0 {
		t.Fatalf("%d samples, %d over allocatable", samples.Load(), over.Load())
	}
	t.Logf("placed %d + %d of %d creates; %d samples of the database, none over", len(placed), len(placed2), 2*creates, samples.Load())
}

// placementCountsWarm: what a node's warm pool holds (its registration,
// then each HeartbeatWarm) counts beside its reservations: a node whose
// allocatable - reserved - warm is too small for a claim is passed over
// as full, for another node or capacity_exhausted; once its pool holds
// less it takes the claim.
func placementCountsWarm(t *testing.T, open Opener) {
	ctx := context.Background()
	s, _ := open(t, newClock().now)
	a, b := newNode("a"), newNode("b")
	// a's pool holds 1800 of its 2000 millis and 1 of its 4 sandboxes.
	warm := manager.NodeAlloc{CPUMillis: 1800, MemoryBytes: 1 << 30, DiskBytes: 1 << 30, Sandboxes: 1}
	r := a.reg(small(), both, "busybox")
	r.Warm = warm
	if got := must(s.RegisterNode(ctx, r))(t); got.Warm != warm {
		t.Fatalf("registered warm %+v, want %+v", got.Warm, warm)
	}
	place := func(id string, cpu int64) (manager.Placement, error) {
		return s.Place(ctx, manager.PlaceIntent{SandboxID: id, OperationID: "op-" + id, Spec: spec(cpu, api.RootFSOverlay, "busybox")})
	}
	// 300 millis do not fit a's 200 left beside its pool.
	if _, err := place("x1", 300); errdefs.CodeOf(err) != errdefs.CodeCapacityExhausted || !strings.Contains(err.Error(), "a: full") {
		t.Fatalf("place 300m beside a pool of 1800m of 2000m: %v, want capacity_exhausted (a: full)", err)
	}
	// 200 do (and are reserved).
	if p := must(place("x2", 200))(t); p.NodeID != "a" {
		t.Fatalf("place 200m on %s, want a", p.NodeID)
	}
	// Another node without a pool takes what a cannot.
	must(s.RegisterNode(ctx, b.reg(small(), both, "busybox")))(t)
	if p := must(place("x3", 300))(t); p.NodeID != "b" {
		t.Fatalf("place 300m with b free: on %s, want b", p.NodeID)
	}
	// A heartbeat says the pool holds less now: a fits again, and with
	// less load than b it is chosen (template bonus too).
	if _, err := s.HeartbeatWarm(ctx, "a", manager.NodeAlloc{}); err != nil {
		t.Fatal(err)
	}
	if got := must(s.FleetNode(ctx, "a"))(t); got.Warm != (manager.NodeAlloc{}) || got.Reserved.CPUMillis != 200 {
		t.Fatalf("a after its heartbeat: warm %+v reserved %+v", got.Warm, got.Reserved)
	}
	if p := must(place("x4", 300))(t); p.NodeID != "a" {
		t.Fatalf("place 300m with a's pool empty: on %s, want a", p.NodeID)
	}
	// A plain heartbeat keeps what the last one said; a negative one is refused.
	must(s.HeartbeatWarm(ctx, "a", warm))(t)
	must(s.Heartbeat(ctx, "a"))(t)
	if got := must(s.FleetNode(ctx, "a"))(t); got.Warm != warm {
		t.Fatalf("warm after a plain heartbeat %+v, want %+v", got.Warm, warm)
	}
	if _, err := s.HeartbeatWarm(ctx, "a", manager.NodeAlloc{CPUMillis: -1}); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
		t.Fatalf("negative warm: %v, want invalid_argument", err)
	}
}
