package service

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/ctld/ctld/client"
)

// collector follows a client's events into a list.
type collector struct {
	mu     sync.Mutex
	events []client.Event
	done   chan error
	cancel context.CancelFunc
}

func follow(t *testing.T, c *client.Client, sandbox string) *collector {
	t.Helper()
	return followAfter(t, c, sandbox, -1)
}

// followAfter follows from a cursor (-1: live events only).
func followAfter(t *testing.T, c *client.Client, sandbox string, after int64) *collector {
	t.Helper()
	schema := loadDoc().Components.Schemas["Event"].Value
	ctx, cancel := context.WithCancel(context.Background())
	col := &collector{done: make(chan error, 1), cancel: cancel}
	go func() {
		col.done <- c.EventsAfter(ctx, sandbox, after, func(ev client.Event) error {
			b, _ := json.Marshal(ev)
			var v any
			_ = json.Unmarshal(b, &v)
			if err := schema.VisitJSON(v); err != nil {
				t.Errorf("event %s does not match the Event schema: %v", b, err)
			}
			col.mu.Lock()
			col.events = append(col.events, ev)
			col.mu.Unlock()
			return nil
		})
	}()
	t.Cleanup(func() { cancel(); <-col.done })
	return col
}

func (c *collector) wait(t *testing.T, n int) []client.Event {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.mu.Lock()
		got := append([]client.Event(nil), c.events...)
		c.mu.Unlock()
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("got %d events %+v, want %d", len(got), got, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (e *env) waitFollowers(n int) {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		e.srv.events.mu.Lock()
		got := len(e.srv.events.followers)
		e.srv.events.mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%d followers, want %d", got, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestEvents(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	a := follow(t, e.a, "")
	b := follow(t, e.b, "")
	e.waitFollowers(2)
	blk, err := e.a.Create(ctx, client.CreateRequest{Template: "debian"})
	if err != nil {
		t.Fatal(err)
	}
	only := follow(t, e.a, blk.ID)
	e.waitFollowers(3)
	if _, err := e.a.Pause(ctx, blk.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.a.Resume(ctx, blk.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.a.Destroy(ctx, blk.ID); err != nil {
		t.Fatal(err)
	}
	short, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox", TimeoutSec: 10})
	if err != nil {
		t.Fatal(err)
	}
	e.clock.advance(11 * time.Second)
	mine, err := e.b.Create(ctx, client.CreateRequest{Template: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	got := a.wait(t, 8)
	want := []struct{ typ, id, reason string }{
		{"created", blk.ID, ""}, {"ready", blk.ID, ""}, {"paused", blk.ID, ""}, {"resumed", blk.ID, ""}, {"destroyed", blk.ID, "destroyed"},
		{"created", short.ID, ""}, {"ready", short.ID, ""}, {"destroyed", short.ID, "timeout"},
	}
	for i, w := range want {
		if got[i].Type != w.typ || got[i].SandboxID != w.id || got[i].Reason != w.reason {
			t.Errorf("event %d = %+v, want %s %s %q", i, got[i], w.typ, w.id, w.reason)
		}
	}
	// team-b saw only its own sandbox; the filtered follower only blk's.
	for _, ev := range b.wait(t, 2) {
		if ev.SandboxID != mine.ID {
			t.Errorf("team-b saw %+v", ev)
		}
	}
	for _, ev := range only.wait(t, 3) {
		if ev.SandboxID != blk.ID {
			t.Errorf("filtered follower saw %+v", ev)
		}
	}
}

// TestEventFollowersBounded: 1000 followers each get an event; one more
// is refused as unavailable with Retry-After; a follower that does not
// read is cut off after a full queue instead of growing it.
func TestEventFollowersBounded(t *testing.T) {
	e := newEnv(t, func(s *Server) { s.MaxFollowers = 1000 })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tr := &http.Transport{MaxIdleConnsPerHost: 1000}
	defer tr.CloseIdleConnections()
	c := &client.Client{BaseURL: e.url, Key: e.keyA, HTTP: &http.Client{Transport: tr}}
	var wg sync.WaitGroup
	got := make(chan string, 1000)
	for range 1000 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.Events(ctx, "", func(ev client.Event) error {
				got <- ev.Type
				return errors.New("enough")
			})
		}()
	}
	e.waitFollowers(1000)
	_, err := e.a.Templates(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	err = (&client.Client{BaseURL: e.url, Key: e.keyA, HTTP: e.a.HTTP}).Events(context.Background(), "", func(client.Event) error { return nil })
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != client.CodeUnavailable || ce.RetryAfter <= 0 {
		t.Fatalf("follower 1001: %v", err)
	}
	start := time.Now()
	if _, err := e.a.Create(context.Background(), client.CreateRequest{Template: "busybox"}); err != nil {
		t.Fatal(err)
	}
	for range 1000 {
		select {
		case <-got:
		case <-time.After(30 * time.Second):
			t.Fatal("a follower got no event")
		}
	}
	t.Logf("1000 followers got the created event within %v", time.Since(start).Round(time.Millisecond))
	wg.Wait()

	// A follower that never reads: the broker drops it after its queue.
	var b broker
	f := b.subscribe("o", "", 10)
	for range followerQueue + 50 {
		b.publish("o", client.Event{Type: "created"})
	}
	n := 0
	for range f.ch {
		n++
	}
	if !f.dropped || n != followerQueue {
		t.Fatalf("slow follower: dropped %v after %d queued events; want dropped after %d", f.dropped, n, followerQueue)
	}
}

// TestEventsResumeFromCursorAfterRestart: events are journaled; a
// follower that reconnects after a restart of the server with its last
// seq gets what happened while it was away (across the restart), in
// order, then the live events, none twice.
func TestEventsResumeFromCursorAfterRestart(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	// From the start of the journal: no race with the subscription.
	col := followAfter(t, e.a, "", 0)
	sb1, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	first := col.wait(t, 2)
	if first[0].Type != client.EventCreated || first[1].Type != client.EventReady || first[1].Seq <= first[0].Seq {
		t.Fatalf("first events: %+v", first)
	}
	cursor := first[1].Seq
	e.restart(nil)
	// While the follower is away: another sandbox, and team-b's.
	sb2, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.b.Create(ctx, client.CreateRequest{Template: "busybox"}); err != nil {
		t.Fatal(err)
	}
	again := followAfter(t, e.a, "", cursor)
	missed := again.wait(t, 2)
	if missed[0].SandboxID != sb2.ID || missed[0].Type != client.EventCreated || missed[1].Type != client.EventReady || missed[0].Seq <= cursor {
		t.Fatalf("replayed after %d: %+v", cursor, missed)
	}
	if _, err := e.a.Destroy(ctx, sb1.ID); err != nil {
		t.Fatal(err)
	}
	got := again.wait(t, 3)
	if got[2].SandboxID != sb1.ID || got[2].Type != client.EventDestroyed {
		t.Fatalf("live after the replay: %+v", got)
	}
	time.Sleep(100 * time.Millisecond)
	again.mu.Lock()
	n := len(again.events)
	again.mu.Unlock()
	if n != 3 {
		t.Fatalf("%d events after the resume, want 3 (none twice, none of team-b's)", n)
	}
	// From the start of the journal: everything team-a's, across the restart.
	all := followAfter(t, e.a, "", 0).wait(t, 5)
	for i := 1; i < len(all); i++ {
		if all[i].Seq <= all[i-1].Seq {
			t.Fatalf("events out of order: %+v", all)
		}
	}
	if all[0].SandboxID != sb1.ID || all[4].Type != client.EventDestroyed {
		t.Fatalf("all events: %+v", all)
	}
	// A bad cursor is refused.
	resp, _ := e.raw(invalid(ctx), http.MethodGet, "/v1/events?after=-3", e.keyA, nil, nil)
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("after=-3: %d", resp.StatusCode)
	}
}
