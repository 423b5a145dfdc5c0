package service

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/ctld/ctld/client"
)

// TestOnExitPages: the exit watch reads its sandboxes a page at a time
// (here one a page) from a cursor, so an exit is seen however many
// sandboxes come before it; exited on_exit keep sandboxes are not read
// again. A resumed sandbox's new generation starts without the previous
// exit and its own exit is recorded, with its own event.
func TestOnExitPages(t *testing.T) {
	e := newEnv(t, func(s *Server) { s.exitsPage = 1 })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := make(chan client.Event, 64)
	go e.a.EventsAfter(ctx, "", 0, func(ev client.Event) error { events <- ev; return nil })
	var ids []string
	for range 3 {
		sb, err := e.a.Create(ctx, client.CreateRequest{Template: "debian"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	slices.Sort(ids)
	if err := e.node.Exit(ids[2], 4); err != nil {
		t.Fatal(err)
	}
	if sb := waitState(t, e.a, ids[2], client.StateExited); sb.Exit == nil || sb.Exit.Code != 4 {
		t.Fatalf("last sandbox: %+v exit %+v, want exit code 4", sb, sb.Exit)
	}
	if err := e.node.Exit(ids[0], 5); err != nil {
		t.Fatal(err)
	}
	if sb := waitState(t, e.a, ids[0], client.StateExited); sb.Exit == nil || sb.Exit.Code != 5 {
		t.Fatalf("first sandbox: %+v exit %+v, want exit code 5", sb, sb.Exit)
	}
	if p, err := e.a.Pause(ctx, ids[0]); err != nil || p.State != client.StatePaused {
		t.Fatalf("pause of the exited sandbox = %+v, %v", p, err)
	}
	r, err := e.a.Resume(ctx, ids[0])
	if err != nil || r.State != client.StateReady || r.Generation != 2 || r.Exit != nil {
		t.Fatalf("resume = %+v, %v; want generation 2 ready without an exit", r, err)
	}
	if err := e.node.Exit(ids[0], 6); err != nil {
		t.Fatal(err)
	}
	if sb := waitState(t, e.a, ids[0], client.StateExited); sb.Exit == nil || sb.Exit.Code != 6 {
		t.Fatalf("resumed sandbox: %+v exit %+v, want exit code 6", sb, sb.Exit)
	}
	var got []string
	for timeout := time.After(5 * time.Second); len(got) < 3; {
		select {
		case ev := <-events:
			if ev.Type == client.EventExited {
				got = append(got, ev.SandboxID+" "+ev.Reason)
			}
		case <-timeout:
			t.Fatalf("exited events %q after 5s, want 3", got)
		}
	}
	want := []string{ids[2] + " exited: code 4", ids[0] + " exited: code 5", ids[0] + " exited: code 6"}
	if !slices.Equal(got, want) {
		t.Fatalf("exited events %q, want %q", got, want)
	}
}
