package fleettest

import (
	"context"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/manager"
)

// placedExitsAndEgress: a node process records its ctld's exit of a
// generation only while the database gives the node that generation
// (another node, or an older generation, is fenced), once; the fleet's
// view of the sandbox (Manager.NodeSandbox) shows it exited with the
// code, and its egress summed from its node's usage records of that
// generation alone.
func placedExitsAndEgress(t *testing.T, open Opener) {
	ctx := context.Background()
	s, _ := open(t, newClock().now)
	a, b := newNode("a"), newNode("b")
	must(s.RegisterNode(ctx, a.reg(small(), both)))(t)
	p := must(s.Place(ctx, manager.PlaceIntent{SandboxID: "x", OperationID: "cx", Spec: spec(100, api.RootFSOverlay, "")}))(t)
	must(s.RegisterNode(ctx, b.reg(small(), both)))(t)
	if p.NodeID != "a" {
		t.Fatalf("placed on %s, want a", p.NodeID)
	}
	if err := s.FinishPlacedClaim(ctx, "a", "cx", api.Sandbox{ID: "x", Generation: 1, State: api.StateReady}); err != nil {
		t.Fatal(err)
	}
	m := &manager.Manager{Store: s, Fleet: &manager.Fleet{}}
	e := manager.SandboxExit{Kind: api.ExitNormal, Code: 7, At: time.Date(2026, 12, 6, 8, 0, 1, 0, time.UTC)}
	for _, c := range []struct {
		node string
		gen  uint64
	}{{"b", 1}, {"a", 2}} {
		if _, err := s.RecordPlacedExit(ctx, c.node, "x", c.gen, e); errdefs.CodeOf(err) != errdefs.CodeFenced {
			t.Fatalf("exit of x generation %d recorded by %s: %v, want fenced", c.gen, c.node, err)
		}
	}
	if sb := must(m.NodeSandbox(ctx, "x"))(t); sb.State != api.StateReady || sb.Exit != nil || sb.Network != nil {
		t.Fatalf("before any exit or usage: %+v", sb)
	}
	if first := must(s.RecordPlacedExit(ctx, "a", "x", 1, e))(t); !first {
		t.Fatal("first exit record: not first")
	}
	if first := must(s.RecordPlacedExit(ctx, "a", "x", 1, e))(t); first {
		t.Fatal("a repeated exit record counts as first")
	}
	at := time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC)
	rec := func(seq uint64, id string, gen, tx uint64) api.UsageRecord {
		return api.UsageRecord{Seq: seq, SandboxID: id, Generation: gen, Start: at, End: at.Add(time.Minute), Usage: api.Usage{TxBytes: tx, TxPackets: 1}}
	}
	must(s.StoreUsage(ctx, "a", []api.UsageRecord{rec(1, "x", 1, 100), rec(2, "y", 1, 1000), rec(3, "x", 1, 20), rec(4, "x", 0, 5000)}, 4))(t)
	must(s.StoreUsage(ctx, "b", []api.UsageRecord{rec(1, "x", 1, 7000)}, 1))(t) // not x's node
	sb := must(m.NodeSandbox(ctx, "x"))(t)
	if sb.State != api.StateExited || sb.Exit == nil || sb.Exit.Code != 7 || !sb.Exit.At.Equal(e.At) {
		t.Fatalf("the fleet's view after the exit: %+v exit %+v", sb, sb.Exit)
	}
	if sb.Network == nil || sb.Network.TxBytes != 120 || sb.Network.TxPackets != 2 {
		t.Fatalf("the fleet's view of egress: %+v, want 120 bytes in 2 packets (node a's records of generation 1 only)", sb.Network)
	}
	// Once a release is under way the node's exit is no news.
	if _, _, err := s.RequestRelease(ctx, "x", "rx"); err != nil {
		t.Fatal(err)
	}
	if first := must(s.RecordPlacedExit(ctx, "a", "x", 1, e))(t); first {
		t.Fatal("exit recorded as first for a generation being released")
	}
}

// nodeSandboxesForDrain: a node's live sandboxes with their root modes
// (what `node drain` pauses or waits for), none of another node's or of
// an ended generation; a sandbox no owner has is not marked paused.
func nodeSandboxesForDrain(t *testing.T, open Opener) {
	ctx := context.Background()
	s, _ := open(t, newClock().now)
	a := newNode("a")
	must(s.RegisterNode(ctx, a.reg(small(), both)))(t)
	for _, c := range []struct {
		id   string
		mode api.RootFSMode
	}{{"blk", api.RootFSBlock}, {"ov", api.RootFSOverlay}, {"gone", api.RootFSOverlay}} {
		p := must(s.Place(ctx, manager.PlaceIntent{SandboxID: c.id, OperationID: "c-" + c.id, Spec: spec(100, c.mode, "")}))(t)
		if c.id == "ov" {
			continue // left claiming
		}
		if err := s.FinishPlacedClaim(ctx, "a", p.Operation.OperationID, api.Sandbox{ID: c.id, Generation: 1, State: api.StateReady, RootFS: api.RootFS{Mode: c.mode}}); err != nil {
			t.Fatal(err)
		}
	}
	op, _ := must2(s.RequestRelease(ctx, "gone", "r-gone"))(t)
	must(s.FinishPlacedRelease(ctx, op.OperationID, api.Sandbox{ID: "gone", Generation: 1, State: api.StateReleased}, a.proofOf(op.OperationID, "gone", 1)))(t)
	got := must(s.NodeSandboxes(ctx, "a"))(t)
	if len(got) != 2 || got[0].ID != "blk" || got[0].Mode != api.RootFSBlock || got[0].State != api.StateReady ||
		got[1].ID != "ov" || got[1].State != api.StateClaiming {
		t.Fatalf("node a's sandboxes %+v, want blk (block, ready) and ov (claiming)", got)
	}
	if other := must(s.NodeSandboxes(ctx, "b"))(t); len(other) != 0 {
		t.Fatalf("sandboxes of an unknown node: %+v", other)
	}
	if owned := must(s.MarkDrainPaused(ctx, "blk", "drain"))(t); owned {
		t.Fatal("a sandbox no owner has was marked paused")
	}
}
