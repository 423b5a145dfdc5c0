package service

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/manager"
)

func (e *env) timer(id string) manager.Timer {
	e.t.Helper()
	tm, err := e.store.Timer(context.Background(), id)
	if err != nil {
		e.t.Fatal(err)
	}
	return tm
}

// waitTimerDone waits until the sandbox's timeout is recorded done (the
// sandbox shows destroyed a moment before: the release is recorded first).
func (e *env) waitTimerDone(id string) manager.Timer {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		tm := e.timer(id)
		if tm.State == "done" {
			return tm
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("timer of %s: %+v, want done", id, tm)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestTimeoutFiresAndExtends(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	short, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox", TimeoutSec: 60})
	if err != nil {
		t.Fatal(err)
	}
	long, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox", TimeoutSec: 60})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.a.SetTimeout(ctx, long.ID, 180); err != nil {
		t.Fatal(err)
	}
	e.clock.advance(61 * time.Second)
	waitState(t, e.a, short.ID, client.StateDestroyed)
	e.waitTimerDone(short.ID)
	got, _ := e.a.Get(ctx, short.ID)
	if got.Reason != "timeout" || e.nodeState(short.ID) != api.StateReleased {
		t.Fatalf("after its timeout: %+v, node %s", got, e.nodeState(short.ID))
	}
	tm := e.timer(short.ID)
	if tm.State != "done" || tm.OperationID == "" {
		t.Fatalf("timer = %+v", tm)
	}
	p, err := e.store.Proof(ctx, tm.OperationID)
	if err != nil || !p.Verified {
		t.Fatalf("proof of the timeout's release: %+v, %v", p, err)
	}
	if sb, err := e.a.Get(ctx, long.ID); err != nil || sb.State != client.StateReady {
		t.Fatalf("extended sandbox after 61s: %+v, %v", sb, err)
	}
	e.clock.advance(120 * time.Second)
	waitState(t, e.a, long.ID, client.StateDestroyed)
	e.waitTimerDone(long.ID)
	if _, err := e.a.SetTimeout(ctx, long.ID, 60); errCode(err) != client.CodeConflict {
		t.Fatalf("extending an ended sandbox: %v", err)
	}
	if n := len(e.node.ReleaseOps); n != 2 {
		t.Fatalf("node saw %d releases, want 2", n)
	}
}

// restart stops the server, closes and reopens the database from its file
// and starts a new server on the same address and node: what a manager
// restart keeps is what the database file holds.
func (e *env) restart(tune func(*Server)) {
	e.t.Helper()
	e.shutdown()
	if err := e.store.Close(); err != nil {
		e.t.Fatal(err)
	}
	st, err := manager.OpenStore(context.Background(), e.dbPath, e.clock.now)
	if err != nil {
		e.t.Fatal(err)
	}
	e.store = st
	e.start(tune)
}

// TestTimeoutCompletedOnceAfterCrash: the server dies right after it
// marked a timeout firing (simulated: the AfterMarkFiring hook stops the
// firing there and the server is shut down; nothing after the mark runs,
// like a SIGKILL at that point). The restarted server, on the reopened
// database, completes it: one release on the node, the timer done.
func TestTimeoutCompletedOnceAfterCrash(t *testing.T) {
	marked := make(chan string, 16)
	e := newEnv(t, func(s *Server) {
		s.AfterMarkFiring = func(id string) error {
			marked <- id
			return errors.New("simulated crash after marking the timer firing")
		}
	})
	ctx := context.Background()
	sb, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox", TimeoutSec: 30})
	if err != nil {
		t.Fatal(err)
	}
	e.clock.advance(31 * time.Second)
	if id := <-marked; id != sb.ID {
		t.Fatalf("marked %s", id)
	}
	e.shutdown()
	if st := e.timer(sb.ID).State; st != "firing" || e.nodeState(sb.ID) != api.StateReady || len(e.node.ReleaseOps) != 0 {
		t.Fatalf("after the crash: timer %s, node %s, releases %v", st, e.nodeState(sb.ID), e.node.ReleaseOps)
	}
	e.restart(nil)
	waitState(t, e.a, sb.ID, client.StateDestroyed)
	e.waitTimerDone(sb.ID)
	time.Sleep(100 * time.Millisecond) // a few more ticks: nothing fires again
	tm := e.timer(sb.ID)
	if tm.State != "done" || len(e.node.ReleaseOps) != 1 || e.node.ReleaseOps[0] != tm.OperationID {
		t.Fatalf("timer %+v, node releases %v; want one release, the timer's", tm, e.node.ReleaseOps)
	}
}

// TestTimeoutReleaseOutcomeUnknownThenRestart: the release reached no
// answer (the node dropped it: unavailable) and the server stopped; the
// restarted one sends the same operation id, so the node releases once.
func TestTimeoutReleaseOutcomeUnknownThenRestart(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	e.node.Lock()
	e.node.FailRelease = func(api.ReleaseRequest) error {
		return errdefs.Errorf(errdefs.CodeUnavailable, "connection reset")
	}
	e.node.Unlock()
	sb, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox", TimeoutSec: 30})
	if err != nil {
		t.Fatal(err)
	}
	e.clock.advance(31 * time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for {
		e.node.Lock()
		n := len(e.node.ReleaseOps)
		e.node.Unlock()
		if n >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no release tried")
		}
		time.Sleep(10 * time.Millisecond)
	}
	e.shutdown()
	e.node.Lock()
	e.node.FailRelease = nil
	tried := append([]string(nil), e.node.ReleaseOps...)
	e.node.Unlock()
	e.restart(nil)
	waitState(t, e.a, sb.ID, client.StateDestroyed)
	e.waitTimerDone(sb.ID)
	e.node.Lock()
	ops := append([]string(nil), e.node.ReleaseOps...)
	e.node.Unlock()
	for _, op := range ops {
		if op != tried[0] {
			t.Fatalf("release operation ids %v: a retry used a new id", ops)
		}
	}
	if tm := e.timer(sb.ID); tm.State != "done" || tm.OperationID != tried[0] {
		t.Fatalf("timer %+v", tm)
	}
	t.Logf("release tried %d times before the restart, %d in all, one operation id", len(tried), len(ops))
}

// TestUnsettledCreateCompletedAfterRestart: the node did the claim but
// its answer was lost (unavailable: outcome unknown) and the server
// stops; the sandbox keeps its quota share and shows creating. The
// restarted server finds it ready on the node and completes it with the
// same operation id.
func TestUnsettledCreateCompletedAfterRestart(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	e.node.Lock()
	e.node.LoseClaimAnswer = func(api.ClaimRequest) error { return errdefs.Errorf(errdefs.CodeUnavailable, "connection reset") }
	e.node.Unlock()
	if _, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox", Labels: map[string]string{"k": "lost"}}); errCode(err) != client.CodeUnavailable {
		t.Fatalf("create with a lost answer: %v", err)
	}
	l, err := e.a.List(ctx, client.ListOptions{Labels: map[string]string{"k": "lost"}})
	if err != nil || len(l.Sandboxes) != 1 || l.Sandboxes[0].State != client.StateCreating {
		t.Fatalf("after the lost answer: %+v, %v", l, err)
	}
	if u, _ := e.store.Usage(ctx, "team-a"); u.Sandboxes != 1 {
		t.Fatalf("usage %+v: an unsettled create keeps its share", u)
	}
	e.shutdown()
	e.node.Lock()
	e.node.LoseClaimAnswer = nil
	first := e.node.ClaimOps[0]
	e.node.Unlock()
	e.restart(nil)
	waitState(t, e.a, l.Sandboxes[0].ID, client.StateReady)
	e.node.Lock()
	ops := append([]string(nil), e.node.ClaimOps...)
	e.node.Unlock()
	if len(ops) != 2 || ops[1] != first {
		t.Fatalf("node claims %v: want the first operation id again", ops)
	}
}

// TestUnsettledCreateSettledByTheSweeper: the claim never reached the
// node (dropped: outcome unknown to the server), so the create's lease is
// given up for a sweeper. The server stops; the restarted one (its
// sweeper) completes the create while it is younger than CreateTimeout,
// with the operation id recorded for it (one claim operation on the node,
// generation 1). A second such create found only after CreateTimeout is
// marked failed with the reason, its quota share back, a failed event,
// and is not claimed afresh.
func TestUnsettledCreateSettledByTheSweeper(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	dropped := func(label string) string {
		t.Helper()
		e.node.Lock()
		e.node.FailClaim = func(api.ClaimRequest) error { return errdefs.Errorf(errdefs.CodeUnavailable, "connection reset") }
		e.node.Unlock()
		if _, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox", Labels: map[string]string{"k": label}}); errCode(err) != client.CodeUnavailable {
			t.Fatalf("create with a dropped claim: %v", err)
		}
		l, err := e.a.List(ctx, client.ListOptions{Labels: map[string]string{"k": label}})
		if err != nil || len(l.Sandboxes) != 1 || l.Sandboxes[0].State != client.StateCreating {
			t.Fatalf("after the dropped claim: %+v, %v", l, err)
		}
		e.shutdown()
		e.node.Lock()
		e.node.FailClaim = nil
		e.node.Unlock()
		return l.Sandboxes[0].ID
	}
	claimOps := func() map[string]bool {
		e.node.Lock()
		defer e.node.Unlock()
		m := map[string]bool{}
		for _, op := range e.node.ClaimOps {
			m[op] = true
		}
		return m
	}

	id := dropped("completed")
	e.restart(nil)
	waitState(t, e.a, id, client.StateReady)
	if ops := claimOps(); len(ops) != 1 {
		t.Fatalf("node claim operations %v: want the one recorded operation id, sent again", ops)
	}
	if st := e.nodeState(id); st != api.StateReady {
		t.Fatalf("node state %q", st)
	}

	id = dropped("failed")
	before := claimOps()
	e.clock.advance(DefaultCreateTimeout + time.Minute)
	e.restart(nil)
	sb := waitState(t, e.a, id, client.StateFailed)
	if !strings.Contains(sb.Reason, "create interrupted") {
		t.Fatalf("reason %q", sb.Reason)
	}
	if u, _ := e.store.Usage(ctx, "team-a"); u.Sandboxes != 1 {
		t.Fatalf("usage %+v: the failed create gives its share back (the completed one holds 1)", u)
	}
	time.Sleep(100 * time.Millisecond)
	if after := claimOps(); len(after) != len(before) || e.nodeState(id) != "" {
		t.Fatalf("the interrupted create was claimed afresh: %d claim operations, before %d; node state %q", len(after), len(before), e.nodeState(id))
	}
	if msb, err := e.store.Sandbox(ctx, id); err != nil || msb.State != api.StateFailed {
		t.Fatalf("the manager's record: %+v, %v", msb, err)
	}
}
