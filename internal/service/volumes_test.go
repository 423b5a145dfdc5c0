package service

import (
	"context"
	"strings"
	"testing"

	"github.com/ctld/ctld/client"
)

// TestSnapshotRestoreFork: a running block-mode sandbox is snapshotted
// (named, listed; a duplicate or bad name is refused); a fork from the
// snapshot is a new ready sandbox of the same spec whose volume is the
// snapshot's generation; a fork from a missing snapshot ends its admitted
// sandbox (failed, its share back); a restore needs the sandbox paused and
// moves its head to the snapshot, and resume runs from there. Overlay
// sandboxes have none of these.
func TestSnapshotRestoreFork(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	ov, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.a.Snapshot(ctx, ov.ID, "s1"); errCode(err) != client.CodeInvalidArgument {
		t.Fatalf("snapshot of an overlay sandbox: %v", err)
	}
	if _, err := e.a.Fork(ctx, ov.ID, client.ForkRequest{}); errCode(err) != client.CodeInvalidArgument {
		t.Fatalf("fork of an overlay sandbox: %v", err)
	}
	blk, err := e.a.Create(ctx, client.CreateRequest{Template: "debian", Resources: &client.Resources{CPU: "250m", Memory: "128Mi"}})
	if err != nil {
		t.Fatal(err)
	}
	if l, err := e.a.Snapshots(ctx, blk.ID); err != nil || len(l) != 0 {
		t.Fatalf("snapshots before any: %+v, %v", l, err)
	}
	s1, err := e.a.Snapshot(ctx, blk.ID, "s1")
	if err != nil || s1.Name != "s1" || s1.Generation != 1 {
		t.Fatalf("snapshot s1: %+v, %v", s1, err)
	}
	if _, err := e.a.Snapshot(ctx, blk.ID, "s1"); errCode(err) != client.CodeConflict {
		t.Fatalf("second snapshot s1: %v", err)
	}
	if _, err := e.a.Snapshot(invalid(ctx), blk.ID, "Bad Name"); errCode(err) != client.CodeInvalidArgument {
		t.Fatalf("snapshot with a bad name: %v", err)
	}
	if _, err := e.a.Snapshot(ctx, blk.ID, "s2"); err != nil {
		t.Fatal(err)
	}
	if l, err := e.a.Snapshots(ctx, blk.ID); err != nil || len(l) != 2 || l[0] != s1 || l[1].Generation != 2 {
		t.Fatalf("snapshots: %+v, %v", l, err)
	}

	// Fork from s1: a new sandbox, ready, same spec, its volume at s1.
	f, err := e.a.Fork(ctx, blk.ID, client.ForkRequest{Snapshot: "s1", Labels: map[string]string{"from": "s1"}, TimeoutSec: 600})
	if err != nil || f.ID == blk.ID || f.State != client.StateReady || f.Template != "debian" || f.Resources != blk.Resources || f.Labels["from"] != "s1" || f.EndsAt == nil {
		t.Fatalf("fork: %+v, %v (source %+v)", f, err, blk)
	}
	if v, err := e.node.Volume(ctx, f.ID); err != nil || v.Head.Generation != s1.Generation {
		t.Fatalf("the fork's volume: %+v, %v; want generation %d", v, err, s1.Generation)
	}
	if st := e.nodeState(f.ID); st != "ready" {
		t.Fatalf("the fork on the node: %q", st)
	}
	// From a snapshot the source lacks: refused, the admitted sandbox ended.
	if _, err := e.a.Fork(ctx, blk.ID, client.ForkRequest{Snapshot: "nope"}); errCode(err) != client.CodeNotFound {
		t.Fatalf("fork from a missing snapshot: %v", err)
	}
	l, err := e.a.List(ctx, client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var failed int
	for _, sb := range l.Sandboxes {
		if sb.State == client.StateFailed && strings.HasPrefix(sb.Reason, "fork failed") {
			failed++
		} else if sb.ID != ov.ID && sb.ID != blk.ID && sb.ID != f.ID {
			t.Errorf("an unexpected sandbox: %+v", sb)
		}
	}
	if failed != 1 {
		t.Fatalf("list after the failed fork: %+v", l.Sandboxes)
	}
	if u, err := e.store.Usage(ctx, "team-a"); err != nil || u.Sandboxes != 3 {
		t.Fatalf("team-a's usage after the failed fork: %+v, %v; want 3 sandboxes", u, err)
	}

	// A fork takes a share of the owner's quota like a create: over it,
	// nothing is forked on the node.
	if _, err := e.store.SetQuota(ctx, "team-a", quotaOf(3)); err != nil {
		t.Fatal(err)
	}
	nodeBefore, _ := e.node.List(ctx)
	if _, err := e.a.Fork(ctx, blk.ID, client.ForkRequest{Snapshot: "s1"}); errCode(err) != client.CodeQuotaExceeded {
		t.Fatalf("fork over the quota: %v", err)
	}
	if nodeAfter, _ := e.node.List(ctx); len(nodeAfter.Sandboxes) != len(nodeBefore.Sandboxes) {
		t.Fatalf("a fork over the quota reached the node: %d sandboxes, before %d", len(nodeAfter.Sandboxes), len(nodeBefore.Sandboxes))
	}

	// Restore: only while paused; the head moves to s1; resume runs.
	if _, err := e.a.Restore(ctx, blk.ID, "s1"); errCode(err) != client.CodeConflict {
		t.Fatalf("restore of a running sandbox: %v", err)
	}
	if _, err := e.a.Pause(ctx, blk.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.a.Snapshot(ctx, blk.ID, "s3"); errCode(err) != client.CodeConflict {
		t.Fatalf("snapshot of a paused sandbox: %v", err)
	}
	if _, err := e.a.Restore(ctx, blk.ID, "nope"); errCode(err) != client.CodeNotFound {
		t.Fatalf("restore to a missing snapshot: %v", err)
	}
	r, err := e.a.Restore(ctx, blk.ID, "s1")
	if err != nil || r.State != client.StatePaused {
		t.Fatalf("restore: %+v, %v", r, err)
	}
	if v, err := e.node.Volume(ctx, blk.ID); err != nil || v.Head.Generation != s1.Generation {
		t.Fatalf("head after the restore: %+v, %v; want generation %d", v, err, s1.Generation)
	}
	if sb, err := e.a.Resume(ctx, blk.ID); err != nil || sb.State != client.StateReady {
		t.Fatalf("resume after the restore: %+v, %v", sb, err)
	}
}
