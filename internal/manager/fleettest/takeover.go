package fleettest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/manager"
)

func opIDs(prefix string) func() (string, error) {
	n := 0
	return func() (string, error) { n++; return fmt.Sprintf("%s-%d", prefix, n), nil }
}

// lostBlockTakenOver: a lost node's block sandbox is placed anew on a
// live node, at the next generation, from its recorded head; the lost
// node's late claim answer and late head are refused (fenced) and change
// nothing; when it registers again, the generation it still holds is
// released on it (its node's work, not the new node's), and its verified
// proof returns its capacity while the new generation runs on.
func lostBlockTakenOver(t *testing.T, open Opener) {
	ctx := context.Background()
	clk := newClock()
	s, b := open(t, clk.now)
	n1, n2 := newNode("n1"), newNode("n2")
	must(s.RegisterNode(ctx, n1.reg(small(), both, "busybox")))(t)
	must(s.RegisterNode(ctx, n2.reg(small(), both, "busybox")))(t)
	must(s.SetNodeState(ctx, "n2", manager.NodeCordoned))(t) // everything on n1 first
	blk := must(s.Place(ctx, manager.PlaceIntent{SandboxID: "blk", OperationID: "c-blk", Spec: spec(300, api.RootFSBlock, "busybox")}))(t)
	ovl := must(s.Place(ctx, manager.PlaceIntent{SandboxID: "ovl", OperationID: "c-ovl", Spec: spec(100, api.RootFSOverlay, "busybox")}))(t)
	if blk.NodeID != "n1" || ovl.NodeID != "n1" {
		t.Fatalf("placed on %s and %s, want n1", blk.NodeID, ovl.NodeID)
	}
	for _, p := range []manager.Placement{blk, ovl} {
		if err := s.FinishPlacedClaim(ctx, "n1", p.Operation.OperationID, api.Sandbox{ID: p.Operation.SandboxID, Generation: 1, State: api.StateReady}); err != nil {
			t.Fatal(err)
		}
	}
	// n2 may not record anything of n1's sandbox.
	if err := s.PublishPlacedHead(ctx, "n2", "blk", 1, api.VolumeHead{Seq: 1, Generation: 1, WriterEpoch: 1, Node: "n2"}); errdefs.CodeOf(err) != errdefs.CodeFenced {
		t.Fatalf("n2 publishing n1's head: %v, want fenced", err)
	}
	must(0, s.PublishPlacedHead(ctx, "n1", "blk", 1, api.VolumeHead{Seq: 1, Generation: 1, WriterEpoch: 7, Node: "n1"}))(t)
	must(s.SetNodeState(ctx, "n2", manager.NodeReady))(t)

	// A pause-free takeover: no room anywhere is retried later.
	clk.add(16 * time.Second)
	must(s.Heartbeat(ctx, "n2"))(t)
	must(b.MarkLostNodes(ctx, 5*time.Second))(t)
	moved, errs := b.TakeOverLost(ctx, opIDs("to"))
	if len(errs) != 0 || len(moved) != 1 {
		t.Fatalf("takeover: %+v, %v; want blk moved", moved, errs)
	}
	m := moved[0]
	if m.SandboxID != "blk" || m.From != "n1" || m.FromGen != 1 || m.NodeID != "n2" || m.Operation.Generation != 2 || m.Head.Seq != 1 {
		t.Fatalf("takeover = %+v", m)
	}
	req, err := manager.ClaimRequestOf(m.Operation)
	if err != nil || req.RootFS.ExpectHead.Seq != 1 || req.RootFS.ExpectHead.Generation != 1 || req.RootFS.Mode != api.RootFSBlock || req.Generation != 2 || req.RootFS.WriterEpoch != 2 {
		t.Fatalf("the new claim asks %+v, %v; want generation 2 (writer epoch 2) from head 1", req, err)
	}
	sb := must(s.Sandbox(ctx, "blk"))(t)
	if sb.NodeID != "n2" || sb.Generation != 2 || sb.State != api.StateClaiming {
		t.Fatalf("blk = %+v", sb)
	}
	if again, errs := s.TakeOverLost(ctx, opIDs("again")); len(again) != 0 || len(errs) != 0 {
		t.Fatalf("a second takeover: %+v, %v", again, errs)
	}
	// The work: n2 has the new claim; n1 has nothing of blk.
	if w := must(s.NodeWork(ctx, "n2"))(t); len(w) != 1 || w[0].OperationID != m.Operation.OperationID {
		t.Fatalf("n2's work: %+v", w)
	}
	if w := must(s.NodeWork(ctx, "n1"))(t); len(w) != 0 {
		t.Fatalf("lost n1's work: %+v", w)
	}
	// n1 comes back late: its answer and its head are refused.
	if err := s.PublishPlacedHead(ctx, "n1", "blk", 1, api.VolumeHead{Seq: 2, Generation: 2, WriterEpoch: 8, Node: "n1"}); errdefs.CodeOf(err) != errdefs.CodeFenced {
		t.Fatalf("the lost node's late head: %v, want fenced", err)
	}
	if h := must(s.Head(ctx, "blk"))(t); h.Seq != 1 || h.Node != "n1" || h.WriterEpoch != 2 {
		t.Fatalf("head after the late publish: %+v, want seq 1 under writer epoch 2", h)
	}
	// The head's compare-and-swap alone refuses the old writer epoch too.
	if err := s.PublishHead(ctx, "blk", api.VolumeHead{Seq: 2, Generation: 2, WriterEpoch: 1, Node: "n1"}); errdefs.CodeOf(err) != errdefs.CodeFenced {
		t.Fatalf("a head of writer epoch 1 after the takeover: %v, want fenced", err)
	}
	if err := s.FinishPlacedClaim(ctx, "n1", blk.Operation.OperationID, api.Sandbox{ID: "blk", Generation: 1, State: api.StateReady}); errdefs.CodeOf(err) != errdefs.CodeFenced {
		t.Fatalf("the lost node's late claim answer: %v, want fenced", err)
	}
	if err := s.FinishPlacedClaim(ctx, "n2", m.Operation.OperationID, api.Sandbox{ID: "blk", Generation: 2, State: api.StateReady}); err != nil {
		t.Fatal(err)
	}
	must(0, s.PublishPlacedHead(ctx, "n2", "blk", 2, api.VolumeHead{Seq: 2, Generation: 3, WriterEpoch: 1, Node: "n2"}))(t)

	// n1 registers again: its stale generation is released on n1.
	must(s.RegisterNode(ctx, n1.reg(small(), both, "busybox")))(t)
	stale := must(s.ReleaseStale(ctx, "n1", opIDs("stale")))(t)
	if len(stale) != 1 || stale[0].SandboxID != "blk" || stale[0].Generation != 1 {
		t.Fatalf("stale on n1: %+v", stale)
	}
	if again := must(s.ReleaseStale(ctx, "n1", opIDs("stale2")))(t); len(again) != 1 || again[0].Operation.OperationID != stale[0].Operation.OperationID {
		t.Fatalf("ReleaseStale again: %+v, want the pending one", again)
	}
	if w := must(s.NodeWork(ctx, "n2"))(t); len(w) != 0 {
		t.Fatalf("n2 got work of n1's stale generation: %+v", w)
	}
	w := must(s.NodeWork(ctx, "n1"))(t)
	if len(w) != 1 || w[0].Kind != manager.KindRelease || w[0].Generation != 1 {
		t.Fatalf("n1's work: %+v", w)
	}
	before := must(s.FleetNode(ctx, "n1"))(t).Reserved
	rec := must(s.FinishPlacedRelease(ctx, w[0].OperationID, api.Sandbox{ID: "blk", Generation: 1, State: api.StateReleased}, n1.proofOf(w[0].OperationID, "blk", 1)))(t)
	if !rec.Verified || rec.VerifyError != "" {
		t.Fatalf("stale release proof: %+v", rec)
	}
	after := must(s.FleetNode(ctx, "n1"))(t).Reserved
	if after.Sandboxes != before.Sandboxes-1 || after.CPUMillis != before.CPUMillis-300 {
		t.Fatalf("n1 reserved %+v -> %+v, want blk's returned", before, after)
	}
	sb = must(s.Sandbox(ctx, "blk"))(t)
	if sb.NodeID != "n2" || sb.Generation != 2 || sb.State != api.StateReady || !strings.Contains(must(s.SandboxReason(ctx, "blk"))(t), "resumed from head 1") {
		t.Fatalf("blk after the stale release: %+v", sb)
	}
	if n := must(s.FleetNode(ctx, "n2"))(t).Reserved; n.Sandboxes != 1 || n.CPUMillis != 300 {
		t.Fatalf("n2 reserved %+v", n)
	}
}

// takeoverFencesNeverPublished: a block sandbox that never published a
// head (it runs from its template) is taken over; the head's
// compare-and-swap alone, without the check that the node holds the
// generation, refuses the old generation's first head: the takeover
// records the new writer epoch even where no head row existed
// (test/model's BUG_TAKEOVER_NO_ROW variant is the code before).
func takeoverFencesNeverPublished(t *testing.T, open Opener) {
	ctx := context.Background()
	clk := newClock()
	s, b := open(t, clk.now)
	n1, n2 := newNode("n1"), newNode("n2")
	must(s.RegisterNode(ctx, n1.reg(small(), both, "busybox")))(t)
	must(s.RegisterNode(ctx, n2.reg(small(), both, "busybox")))(t)
	must(s.SetNodeState(ctx, "n2", manager.NodeCordoned))(t)
	blk := must(s.Place(ctx, manager.PlaceIntent{SandboxID: "blk", OperationID: "c-blk", Spec: spec(300, api.RootFSBlock, "busybox")}))(t)
	must(0, s.FinishPlacedClaim(ctx, "n1", blk.Operation.OperationID, api.Sandbox{ID: "blk", Generation: 1, State: api.StateReady}))(t)
	must(s.SetNodeState(ctx, "n2", manager.NodeReady))(t)
	clk.add(16 * time.Second)
	must(s.Heartbeat(ctx, "n2"))(t)
	must(b.MarkLostNodes(ctx, 5*time.Second))(t)
	if moved, errs := b.TakeOverLost(ctx, opIDs("to")); len(errs) != 0 || len(moved) != 1 || moved[0].Operation.Generation != 2 || moved[0].Head.Seq != 0 {
		t.Fatalf("takeover: %+v, %v; want blk generation 2 from the template", moved, errs)
	}
	if h := must(s.Head(ctx, "blk"))(t); h.Seq != 0 || h.WriterEpoch != 2 {
		t.Fatalf("head after the takeover: %+v, want no head (seq 0) under writer epoch 2", h)
	}
	if err := s.PublishHead(ctx, "blk", api.VolumeHead{Seq: 1, Generation: 1, WriterEpoch: 1, Node: "n1"}); errdefs.CodeOf(err) != errdefs.CodeFenced {
		t.Fatalf("the old generation's first head after the takeover: %v, want fenced", err)
	}
	// The new generation publishes from there.
	must(0, s.FinishPlacedClaim(ctx, "n2", "to-1", api.Sandbox{ID: "blk", Generation: 2, State: api.StateReady}))(t)
	must(0, s.PublishPlacedHead(ctx, "n2", "blk", 2, api.VolumeHead{Seq: 1, Generation: 4, Node: "n2"}))(t)
	if h := must(s.Head(ctx, "blk"))(t); h.Seq != 1 || h.WriterEpoch != 2 || h.Node != "n2" {
		t.Fatalf("head of the new generation: %+v", h)
	}
}

// refusedStaleReleaseKeepsNew: the lost node never made the generation
// the database placed on it (its process had not taken the claim); after
// the takeover, the release of that stale generation is refused by its
// ctld for good (not found) and failed: that changes nothing of the
// sandbox, which runs its new generation elsewhere. (It used to set the
// sandbox to the stale generation's state, lost: fenced for good.)
func refusedStaleReleaseKeepsNew(t *testing.T, open Opener) {
	ctx := context.Background()
	clk := newClock()
	s, b := open(t, clk.now)
	n1, n2 := newNode("n1"), newNode("n2")
	must(s.RegisterNode(ctx, n1.reg(small(), both, "busybox")))(t)
	must(s.RegisterNode(ctx, n2.reg(small(), both, "busybox")))(t)
	must(s.SetNodeState(ctx, "n2", manager.NodeCordoned))(t)
	blk := must(s.Place(ctx, manager.PlaceIntent{SandboxID: "blk", OperationID: "c-blk", Spec: spec(300, api.RootFSBlock, "busybox")}))(t)
	must(0, s.FinishPlacedClaim(ctx, "n1", blk.Operation.OperationID, api.Sandbox{ID: "blk", Generation: 1, State: api.StateReady}))(t)
	must(s.SetNodeState(ctx, "n2", manager.NodeReady))(t)
	clk.add(16 * time.Second)
	must(s.Heartbeat(ctx, "n2"))(t)
	must(b.MarkLostNodes(ctx, 5*time.Second))(t)
	if moved, errs := b.TakeOverLost(ctx, opIDs("to")); len(errs) != 0 || len(moved) != 1 {
		t.Fatalf("takeover: %+v, %v", moved, errs)
	}
	must(0, s.FinishPlacedClaim(ctx, "n2", "to-1", api.Sandbox{ID: "blk", Generation: 2, State: api.StateReady}))(t)
	must(s.RegisterNode(ctx, n1.reg(small(), both, "busybox")))(t)
	stale := must(s.ReleaseStale(ctx, "n1", opIDs("stale")))(t)
	if len(stale) != 1 || stale[0].Generation != 1 {
		t.Fatalf("stale on n1: %+v", stale)
	}
	must(0, s.FailOperation(ctx, stale[0].Operation.OperationID, `not_found: sandbox "blk" not found`))(t)
	if sb := must(s.Sandbox(ctx, "blk"))(t); sb.NodeID != "n2" || sb.Generation != 2 || sb.State != api.StateReady {
		t.Fatalf("blk after its stale generation's release was refused: %+v, want generation 2 ready on n2", sb)
	}
	// n2 still records what it does with the sandbox.
	must(0, s.PublishPlacedHead(ctx, "n2", "blk", 2, api.VolumeHead{Seq: 1, Generation: 4, Node: "n2"}))(t)
}

// lostBlockReadopted: a lost block sandbox is given back to its node only
// while that node is registered and not lost and the database still
// places the generation there; a pending release makes it releasing.
func lostBlockReadopted(t *testing.T, open Opener) {
	ctx := context.Background()
	clk := newClock()
	s, b := open(t, clk.now)
	n1, n2 := newNode("n1"), newNode("n2")
	must(s.RegisterNode(ctx, n1.reg(small(), both, "busybox")))(t)
	must(s.RegisterNode(ctx, n2.reg(small(), both, "busybox")))(t)
	must(s.SetNodeState(ctx, "n2", manager.NodeCordoned))(t)
	for _, id := range []string{"a", "b"} {
		p := must(s.Place(ctx, manager.PlaceIntent{SandboxID: id, OperationID: "c-" + id, Spec: spec(300, api.RootFSBlock, "busybox")}))(t)
		must(0, s.FinishPlacedClaim(ctx, "n1", p.Operation.OperationID, api.Sandbox{ID: id, Generation: 1, State: api.StateReady}))(t)
	}
	must2(s.RequestRelease(ctx, "b", "r-b"))(t)
	clk.add(16 * time.Second)
	must(s.Heartbeat(ctx, "n2"))(t)
	must(b.MarkLostNodes(ctx, 5*time.Second))(t)
	if lost := must(s.LostOn(ctx, "n1"))(t); len(lost) != 2 {
		t.Fatalf("lost on n1: %+v", lost)
	}
	if err := s.ReadoptLost(ctx, "n1", "a", 1); errdefs.CodeOf(err) != errdefs.CodeFenced {
		t.Fatalf("readopt on a lost node: %v, want fenced", err)
	}
	must(s.RegisterNode(ctx, n1.reg(small(), both, "busybox")))(t)
	if err := s.ReadoptLost(ctx, "n1", "a", 2); errdefs.CodeOf(err) != errdefs.CodeFenced {
		t.Fatalf("readopt of another generation: %v, want fenced", err)
	}
	if err := s.ReadoptLost(ctx, "n2", "a", 1); errdefs.CodeOf(err) != errdefs.CodeFenced {
		t.Fatalf("readopt on another node: %v, want fenced", err)
	}
	must(0, s.ReadoptLost(ctx, "n1", "a", 1))(t)
	must(0, s.ReadoptLost(ctx, "n1", "b", 1))(t)
	for id, want := range map[string]api.SandboxState{"a": api.StateReady, "b": api.StateReleasing} {
		if sb := must(s.Sandbox(ctx, id))(t); sb.State != want || sb.NodeID != "n1" || sb.Generation != 1 {
			t.Fatalf("%s readopted: %+v, want %s on n1", id, sb, want)
		}
	}
	if lost := must(s.LostOn(ctx, "n1"))(t); len(lost) != 0 {
		t.Fatalf("lost on n1 after the readopt: %+v", lost)
	}
	must(0, s.PublishPlacedHead(ctx, "n1", "a", 1, api.VolumeHead{Seq: 1, Generation: 1, Node: "n1"}))(t)
}
