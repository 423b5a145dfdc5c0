package service

import (
	"context"
	"testing"
	"time"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/api"
)

// TestIdleEgressIsActivity: a sandbox that makes no call but sends
// traffic out (its node's egress counter grows) outlives its idle
// deadline; once the counter stops growing for the idle timeout, it is
// destroyed.
func TestIdleEgressIsActivity(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	sb, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox", IdleTimeoutSec: 60})
	if err != nil {
		t.Fatal(err)
	}
	e.node.SetEgress(sb.ID, 1000)
	e.clock.advance(61 * time.Second)
	// The due timer looked, saw egress, and moved on.
	deadline := time.Now().Add(5 * time.Second)
	for {
		it, err := e.store.IdleTimer(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if it.Deadline.After(e.clock.now()) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("idle timer not touched by egress: %+v", it)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got, _ := e.a.Get(ctx, sb.ID); got.State != client.StateReady {
		t.Fatalf("a sandbox sending traffic after 61 s idle: %+v", got)
	}
	// More traffic: touched again at the next deadline.
	e.node.SetEgress(sb.ID, 5000)
	e.clock.advance(70 * time.Second)
	time.Sleep(300 * time.Millisecond)
	if got, _ := e.a.Get(ctx, sb.ID); got.State != client.StateReady {
		t.Fatalf("a sandbox still sending traffic: %+v", got)
	}
	// Quiet now: destroyed within idle + slack.
	e.clock.advance(70 * time.Second)
	got := waitState(t, e.a, sb.ID, client.StateDestroyed)
	if got.Reason != "idle" || e.nodeState(sb.ID) != api.StateReleased {
		t.Fatalf("after its idle timeout: %+v, node %s", got, e.nodeState(sb.ID))
	}
}
