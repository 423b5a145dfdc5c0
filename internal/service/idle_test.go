package service

import (
	"context"
	"testing"
	"time"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/api"
)

// TestIdleTimeout: with idle_timeout_sec 60, an overlay sandbox touched
// by an exec outlives its first idle deadline and is destroyed (reason
// idle, proof verified) once idle for 60 s; a block-mode one is paused
// instead (its share kept), and a resume arms its timer again; a sandbox
// without one, and calls by another owner, are never counted.
func TestIdleTimeout(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	ov, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox", IdleTimeoutSec: 60})
	if err != nil {
		t.Fatal(err)
	}
	blk, err := e.a.Create(ctx, client.CreateRequest{Template: "debian", IdleTimeoutSec: 60})
	if err != nil {
		t.Fatal(err)
	}
	none, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.a.Create(invalid(ctx), client.CreateRequest{Template: "busybox", IdleTimeoutSec: -1}); errCode(err) != client.CodeInvalidArgument {
		t.Fatalf("a negative idle timeout: %v", err)
	}
	e.clock.advance(40 * time.Second)
	if r, err := e.a.Exec(ctx, ov.ID, client.ExecRequest{Args: []string{"true"}}); err != nil || r.ExitCode != 0 {
		t.Fatalf("exec: %+v, %v", r, err)
	}
	// Another owner's calls (not_found) do not keep blk alive.
	if _, err := e.b.Exec(ctx, blk.ID, client.ExecRequest{Args: []string{"true"}}); errCode(err) != client.CodeNotFound {
		t.Fatalf("another owner's exec: %v", err)
	}
	e.clock.advance(21 * time.Second)
	waitState(t, e.a, blk.ID, client.StatePaused)
	if got, _ := e.a.Get(ctx, ov.ID); got.State != client.StateReady {
		t.Fatalf("the touched sandbox after 61 s: %+v", got)
	}
	if it, err := e.store.IdleTimer(ctx, blk.ID); err != nil || it.State != "done" || it.Action != "pause" || it.OperationID == "" {
		t.Fatalf("blk's idle timer: %+v, %v", it, err)
	}
	if u, _ := e.store.Usage(ctx, "team-a"); u.Sandboxes != 3 {
		t.Fatalf("usage after the idle pause: %+v (a paused sandbox keeps its share)", u)
	}
	// 40 s + 60 s (+ the slack, 6 s) after the exec, ov is destroyed.
	e.clock.advance(50 * time.Second)
	if got, _ := e.a.Get(ctx, ov.ID); got.State != client.StateReady {
		t.Fatalf("the touched sandbox 71 s after its touch... %+v", got)
	}
	e.clock.advance(20 * time.Second)
	got := waitState(t, e.a, ov.ID, client.StateDestroyed)
	if got.Reason != "idle" || e.nodeState(ov.ID) != api.StateReleased {
		t.Fatalf("after its idle timeout: %+v, node %s", got, e.nodeState(ov.ID))
	}
	it, err := e.store.IdleTimer(ctx, ov.ID)
	if err != nil || it.Action != "destroy" {
		t.Fatalf("ov's idle timer: %+v, %v", it, err)
	}
	if p, err := e.store.Proof(ctx, it.OperationID); err != nil || !p.Verified {
		t.Fatalf("proof of the idle release: %+v, %v", p, err)
	}
	if got, _ := e.a.Get(ctx, none.ID); got.State != client.StateReady {
		t.Fatalf("the sandbox without an idle timeout: %+v", got)
	}
	// A resume arms blk's timer again, from the resume.
	if r, err := e.a.Resume(ctx, blk.ID); err != nil || r.State != client.StateReady {
		t.Fatalf("resume: %+v, %v", r, err)
	}
	e.clock.advance(50 * time.Second)
	time.Sleep(100 * time.Millisecond)
	if got, _ := e.a.Get(ctx, blk.ID); got.State != client.StateReady {
		t.Fatalf("50 s after the resume: %+v", got)
	}
	e.clock.advance(11 * time.Second)
	waitState(t, e.a, blk.ID, client.StatePaused)
}

// TestIdleFiringCompletedOnceAfterRestart: an idle timer left firing by
// a server that stopped is completed by the next one: one release.
func TestIdleFiringCompletedOnceAfterRestart(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	sb, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox", IdleTimeoutSec: 30})
	if err != nil {
		t.Fatal(err)
	}
	e.shutdown()
	e.clock.advance(31 * time.Second)
	if _, ok, err := e.store.MarkIdleFiring(ctx, sb.ID); err != nil || !ok {
		t.Fatalf("mark firing: %v, %v", ok, err)
	}
	e.restart(nil)
	waitState(t, e.a, sb.ID, client.StateDestroyed)
	time.Sleep(100 * time.Millisecond) // a few more ticks: nothing fires again
	it, err := e.store.IdleTimer(ctx, sb.ID)
	if err != nil || it.State != "done" || len(e.node.ReleaseOps) != 1 || e.node.ReleaseOps[0] != it.OperationID {
		t.Fatalf("idle timer %+v, %v; node releases %v; want one release, the timer's", it, err, e.node.ReleaseOps)
	}
}
