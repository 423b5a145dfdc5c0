package service

import (
	"context"
	"testing"
	"time"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/api"
)

// TestOnExit: a sandbox whose workload exits on its node (the node
// journals state exited with the code) shows state exited with its code
// (on_exit keep) or is destroyed with a verified proof and its quota back
// (on_exit destroy); each gets one "exited" event with the code in the
// event stream, also across a server restart; a bad on_exit is refused.
func TestOnExit(t *testing.T) {
	e := newEnv(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := make(chan client.Event, 64)
	go e.a.EventsAfter(ctx, "", 0, func(ev client.Event) error { events <- ev; return nil })

	if _, err := e.a.Create(invalid(ctx), client.CreateRequest{Template: "busybox", OnExit: "vanish"}); errCode(err) != client.CodeInvalidArgument {
		t.Fatalf("on_exit vanish: %v, want invalid_argument", err)
	}
	keep, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	gone, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox", OnExit: client.OnExitDestroy})
	if err != nil {
		t.Fatal(err)
	}
	before, err := e.store.Usage(ctx, "team-a")
	if err != nil || before.Sandboxes != 2 {
		t.Fatalf("usage before: %+v %v", before, err)
	}
	if err := e.node.Exit(keep.ID, 7); err != nil {
		t.Fatal(err)
	}
	if err := e.node.Exit(gone.ID, 3); err != nil {
		t.Fatal(err)
	}
	sb := waitState(t, e.a, keep.ID, client.StateExited)
	if sb.Exit == nil || sb.Exit.Kind != "exit" || sb.Exit.Code != 7 {
		t.Fatalf("kept sandbox: %+v exit %+v, want exit code 7", sb, sb.Exit)
	}
	sb = waitState(t, e.a, gone.ID, client.StateDestroyed)
	if sb.Exit == nil || sb.Exit.Code != 3 || sb.Reason != "exited: code 3" || e.nodeState(gone.ID) != api.StateReleased {
		t.Fatalf("destroyed on exit: %+v exit %+v, node %s", sb, sb.Exit, e.nodeState(gone.ID))
	}
	ops, err := e.store.Operations(ctx, gone.ID)
	if err != nil {
		t.Fatal(err)
	}
	var verified bool
	for _, op := range ops {
		if op.Kind == "release" {
			p, err := e.store.Proof(ctx, op.OperationID)
			verified = err == nil && p.Verified
		}
	}
	if !verified {
		t.Fatalf("no verified clean proof of the release on exit: %+v", ops)
	}
	if u, _ := e.store.Usage(ctx, "team-a"); u.Sandboxes != 1 {
		t.Fatalf("usage after the destroy on exit: %+v, want 1 sandbox (the kept one)", u)
	}
	// Both exited events reached the follower (before the restart ends
	// its stream).
	exited := map[string]string{}
	for timeout := time.After(10 * time.Second); len(exited) < 2; {
		select {
		case ev := <-events:
			if ev.Type == client.EventExited {
				if _, dup := exited[ev.SandboxID]; dup {
					t.Fatalf("a second exited event for %s", ev.SandboxID)
				}
				exited[ev.SandboxID] = ev.Reason
			}
		case <-timeout:
			t.Fatalf("exited events %v after 10s, want one each", exited)
		}
	}
	if exited[keep.ID] != "exited: code 7" || exited[gone.ID] != "exited: code 3" {
		t.Fatalf("exited events %v, want one each with its code", exited)
	}
	// A restart neither forgets the exit nor sends its event again.
	e.restart(nil)
	time.Sleep(100 * time.Millisecond) // a few timer ticks
	if sb, err := e.a.Get(ctx, keep.ID); err != nil || sb.State != client.StateExited || sb.Exit == nil || sb.Exit.Code != 7 {
		t.Fatalf("kept sandbox after a restart: %+v %v", sb, err)
	}
	// Destroying the kept one returns its proof.
	res, err := e.a.Destroy(ctx, keep.ID)
	if err != nil || !res.Proof.Verified || !res.Proof.Clean || res.Sandbox.Exit == nil || res.Sandbox.Exit.Code != 7 {
		t.Fatalf("destroy of the exited sandbox: %+v %v", res, err)
	}
	// The journal holds one exited event each, across the restart.
	evs, err := e.store.Events(ctx, "team-a", "", 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ev := range evs {
		if ev.Type == client.EventExited {
			n++
		}
	}
	if n != 2 {
		t.Fatalf("%d exited events journaled, want 2", n)
	}
}
