package service

import (
	"context"
	"errors"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/manager"
)

// TestUnknownCreateKeepsItsIdempotencyKey: a create whose claim's outcome
// is unknown (the node dropped it) answers 503, but its Idempotency-Key is
// not freed: the create is the sweeper's to finish, so a retry with the
// key is told to come back (pending) and then gets the finished create's
// answer, the same sandbox, never a second one.
func TestUnknownCreateKeepsItsIdempotencyKey(t *testing.T) {
	e := newEnv(t, func(s *Server) { s.LeaseTTL = time.Second })
	ctx := context.Background()
	e.node.Lock()
	e.node.FailClaim = func(api.ClaimRequest) error { return errdefs.Errorf(errdefs.CodeUnavailable, "connection reset") }
	e.node.Unlock()
	req := client.CreateRequest{Template: "busybox", Labels: map[string]string{"k": "once"}}
	if _, err := e.a.Create(ctx, req, client.IdempotencyKey("k1")); errCode(err) != client.CodeUnavailable {
		t.Fatalf("create with a dropped claim: %v", err)
	}
	var ce *client.Error
	if _, err := e.a.Create(ctx, req, client.IdempotencyKey("k1")); !errors.As(err, &ce) || ce.Code != client.CodeConflict || ce.RetryAfter <= 0 {
		t.Fatalf("retry while the create is unsettled: %v, want conflict with Retry-After (pending)", err)
	}
	e.node.Lock()
	e.node.FailClaim = nil
	e.node.Unlock()
	var sb client.Sandbox
	for deadline := time.Now().Add(10 * time.Second); ; {
		var err error
		sb, err = e.a.Create(ctx, req, client.IdempotencyKey("k1"))
		if err == nil {
			break
		}
		if !errors.As(err, &ce) || ce.Code != client.CodeConflict || time.Now().After(deadline) {
			t.Fatalf("retry after the node is back: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	l, err := e.a.List(ctx, client.ListOptions{Labels: map[string]string{"k": "once"}})
	if err != nil || len(l.Sandboxes) != 1 || l.Sandboxes[0].ID != sb.ID || sb.State != client.StateReady {
		t.Fatalf("the replayed answer %+v; sandboxes %+v, %v: want one, ready", sb, l, err)
	}
	e.node.Lock()
	ops := map[string]bool{}
	for _, op := range e.node.ClaimOps {
		ops[op] = true
	}
	e.node.Unlock()
	if len(ops) != 1 {
		t.Fatalf("node claim operations %v: want one", ops)
	}
}

// TestVolumeOfALiveReplicaIsNotSettled: a server that starts (or sweeps)
// leaves alone a volume create that another replica runs (its lease is
// live), and settles it (failed, what it made removed) once that lease
// expired.
func TestVolumeOfALiveReplicaIsNotSettled(t *testing.T) {
	e := newEnv(t, func(s *Server) { s.LeaseTTL = time.Second })
	ctx := context.Background()
	const id = "vol-0123456789abcdef0123"
	if err := e.store.AdmitVolume(ctx, manager.VolumeAdmission{Owner: "team-a", ID: id, Size: 64 << 10}); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := e.store.TakeLease(ctx, manager.OpLease{ID: leaseVolume + "/" + id, Kind: leaseVolume, Owner: "team-a", Holder: "replica-other"}, time.Hour); err != nil || !ok {
		t.Fatalf("lease: %v, %v", ok, err)
	}
	e.shutdown()
	e.restart(nil)
	time.Sleep(time.Second) // more than one slow sweep cycle (30 x 20ms)
	if v, err := e.store.OwnedVolume(ctx, "team-a", id); err != nil || v.State != manager.VolumeCreating {
		t.Fatalf("volume of a live replica after a start and sweeps: %+v, %v; want still creating", v, err)
	}
	if err := e.store.ExpireLease(ctx, leaseVolume+"/"+id, "replica-other"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		v, err := e.store.OwnedVolume(ctx, "team-a", id)
		if err == nil && v.State == manager.VolumeFailed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("volume after its replica's lease expired: %+v, %v; want failed", v, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestEventsAcrossReplicas: a follower of a second replica on the same
// database gets, in order and once each, the events of sandboxes created
// and destroyed through the first (from the journal it polls), and a
// follower that resumes with a cursor gets nothing twice.
func TestEventsAcrossReplicas(t *testing.T) {
	e := newEnv(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m := &manager.Manager{Store: e.store, Client: &api.Client{SocketPath: e.socket}}
	second := &Server{Manager: m, Store: e.store, Templates: testTemplates, EventPoll: 20 * time.Millisecond, ReplicaID: "replica-2"}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- second.Serve(ctx, ln) }()
	c2 := &client.Client{BaseURL: "http://" + ln.Addr().String(), Key: e.keyA}
	got := make(chan client.Event, 16)
	go c2.Events(ctx, "", func(ev client.Event) error { got <- ev; return nil })
	time.Sleep(200 * time.Millisecond) // the follower subscribes
	sb, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.a.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	var types []string
	var last int64
	for len(types) < 3 {
		select {
		case ev := <-got:
			if ev.SandboxID != sb.ID || ev.Seq <= last {
				t.Fatalf("event %+v after seq %d", ev, last)
			}
			last = ev.Seq
			types = append(types, ev.Type)
		case <-time.After(5 * time.Second):
			t.Fatalf("the second replica's follower got %v of the first's events", types)
		}
	}
	if want := []string{client.EventCreated, client.EventReady, client.EventDestroyed}; !slices.Equal(types, want) {
		t.Fatalf("events %v, want %v", types, want)
	}
	select {
	case ev := <-got:
		t.Fatalf("an event twice or more: %+v", ev)
	case <-time.After(200 * time.Millisecond):
	}
	cancel()
	if err := <-served; err != nil {
		t.Fatal(err)
	}
}

// TestUnknownResumeIsTakenOver: a resume whose claim's outcome is unknown
// (the node dropped it) is given up to the sweeper, which completes it
// with the recorded operation id once the node answers: the sandbox ends
// ready and no longer paused, claimed once at its new generation.
func TestUnknownResumeIsTakenOver(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	blk, err := e.a.Create(ctx, client.CreateRequest{Template: "debian"})
	if err != nil {
		t.Fatal(err)
	}
	if p, err := e.a.Pause(ctx, blk.ID); err != nil || p.State != client.StatePaused {
		t.Fatalf("pause: %+v, %v", p, err)
	}
	e.node.Lock()
	claimsBefore := len(e.node.ClaimOps)
	e.node.FailClaim = func(api.ClaimRequest) error { return errdefs.Errorf(errdefs.CodeUnavailable, "connection reset") }
	e.node.Unlock()
	if _, err := e.a.Resume(ctx, blk.ID); errCode(err) != client.CodeUnavailable {
		t.Fatalf("resume with a dropped claim: %v", err)
	}
	time.Sleep(100 * time.Millisecond) // the sweeper retries while the node drops
	e.node.Lock()
	e.node.FailClaim = nil
	e.node.Unlock()
	sb := waitState(t, e.a, blk.ID, client.StateReady)
	if sb.Generation != 2 {
		t.Fatalf("resumed at generation %d, want 2", sb.Generation)
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		o, err := e.store.OwnedSandbox(ctx, "team-a", blk.ID)
		if err == nil && !o.Paused {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the resumed sandbox is still recorded paused: %+v, %v", o, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.node.Lock()
	ops := map[string]bool{}
	for _, op := range e.node.ClaimOps[claimsBefore:] {
		ops[op] = true
	}
	e.node.Unlock()
	if len(ops) != 1 {
		t.Fatalf("resume claim operations %v: want one", ops)
	}
}

// TestTimersFireOnceWithTwoReplicas: two replicas on one database check
// the same due timers every 20ms; each timeout is fired by one of them
// (its lease): each timer's firing is attempted once and the node gets
// one release per sandbox.
func TestTimersFireOnceWithTwoReplicas(t *testing.T) {
	e := newEnv(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m := &manager.Manager{Store: e.store, Client: &api.Client{SocketPath: e.socket}}
	second := &Server{Manager: m, Store: e.store, Templates: testTemplates, Now: e.clock.now, TimerInterval: 20 * time.Millisecond, ReplicaID: "replica-2"}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- second.Serve(ctx, ln) }()
	var ids []string
	for range 8 {
		sb, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox", TimeoutSec: 1})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	for _, id := range ids {
		waitState(t, e.a, id, client.StateDestroyed)
	}
	for _, id := range ids {
		tm, err := e.store.Timer(ctx, id)
		if err != nil || tm.State != "done" || tm.Attempts != 1 {
			t.Fatalf("timer of %s: %+v, %v; want done at the first attempt", id, tm, err)
		}
	}
	e.node.Lock()
	releases := len(e.node.ReleaseOps)
	e.node.Unlock()
	if releases != len(ids) {
		t.Fatalf("the node got %d releases for %d timeouts", releases, len(ids))
	}
	cancel()
	if err := <-served; err != nil {
		t.Fatal(err)
	}
}
