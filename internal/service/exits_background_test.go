package service

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ctld/ctld/client"
)

// TestOnExitDestroyOffTheTimerLoop: an on_exit destroy the node holds
// does not hold the other timers back (another sandbox's timeout fires
// meanwhile); destroys run one per sandbox, at most MaxExitDestroys at
// once, and each held one completes once the node answers.
func TestOnExitDestroyOffTheTimerLoop(t *testing.T) {
	e := newEnv(t, func(s *Server) { s.MaxExitDestroys = 2 })
	ctx := context.Background()
	var exiting []string
	for range 3 {
		sb, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox", OnExit: client.OnExitDestroy})
		if err != nil {
			t.Fatal(err)
		}
		exiting = append(exiting, sb.ID)
	}
	timed, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox", TimeoutSec: 60})
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]bool{}
	for _, id := range exiting {
		held[id] = true
	}
	var mu sync.Mutex
	inFlight, most, calls := map[string]int{}, 0, map[string]int{}
	release := make(chan struct{})
	var once sync.Once
	unhold := func() { once.Do(func() { close(release) }) }
	defer unhold()
	e.node.Lock()
	e.node.Hold = func(kind, sid string, after bool) error {
		if kind != "release" || !held[sid] {
			return nil
		}
		mu.Lock()
		if after {
			inFlight[sid]--
			mu.Unlock()
			return nil
		}
		inFlight[sid]++
		calls[sid]++
		n := 0
		for _, c := range inFlight {
			n += c
		}
		most = max(most, n)
		mu.Unlock()
		<-release
		return nil
	}
	e.node.Unlock()
	for _, id := range exiting {
		if err := e.node.Exit(id, 0); err != nil {
			t.Fatal(err)
		}
	}
	// Destroys reach the node and are held there; meanwhile the other
	// sandbox's timeout fires, and a second destroy starts.
	waitCalls := func(want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			mu.Lock()
			n := len(calls)
			mu.Unlock()
			if n >= want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d on_exit destroys reached the node after 10s, want %d", n, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitCalls(1)
	e.clock.advance(61 * time.Second)
	waitState(t, e.a, timed.ID, client.StateDestroyed)
	waitCalls(2)
	time.Sleep(100 * time.Millisecond) // more ticks: no third destroy over the cap
	mu.Lock()
	if len(calls) != 2 || most > 2 {
		mu.Unlock()
		t.Fatalf("destroys at the node while two are held: %v (most at once %d), want 2 sandboxes, one destroy each", calls, most)
	}
	for id, c := range calls {
		if c != 1 {
			mu.Unlock()
			t.Fatalf("sandbox %s's destroy sent %d times while one was running", id, c)
		}
	}
	mu.Unlock()
	for _, id := range exiting {
		if sb, _ := e.a.Get(ctx, id); sb.State == client.StateDestroyed {
			t.Fatalf("sandbox %s destroyed while its release was held", id)
		}
	}
	unhold()
	for _, id := range exiting {
		waitState(t, e.a, id, client.StateDestroyed)
	}
	mu.Lock()
	defer mu.Unlock()
	if most > 2 {
		t.Fatalf("%d on_exit destroys ran at once, want at most 2", most)
	}
}
