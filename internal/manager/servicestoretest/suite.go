// Package servicestoretest is the contract of manager.ServiceStore: the
// same suite runs against every backend (SQLite now; PostgreSQL next).
package servicestoretest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/manager"
)

// Opener opens a fresh, empty store whose recorded times come from now.
type Opener func(t *testing.T, now func() time.Time) manager.ServiceStore

// Run runs the whole contract against open's stores.
func Run(t *testing.T, open Opener) {
	for _, c := range []struct {
		name string
		fn   func(*testing.T, Opener)
	}{
		{"Keys", keys},
		{"AdmitConcurrentNeverExceedsQuota", admitConcurrent},
		{"AdmitQuotaAndRate", admitQuotaAndRate},
		{"TimersFireOnce", timersFireOnce},
		{"TimerDueWithinItsSecond", timerDueWithinItsSecond},
		{"IdleTimers", idleTimers},
		{"IdempotencyRecords", idempotencyRecords},
	} {
		t.Run(c.name, func(t *testing.T) { c.fn(t, open) })
	}
}

// Clock is a settable clock for the stores under test.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *Clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *Clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newStore(t *testing.T, open Opener) (manager.ServiceStore, *Clock) {
	clk := &Clock{t: time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC)}
	return open(t, clk.now), clk
}

func keys(t *testing.T, open Opener) {
	ctx := context.Background()
	s, _ := newStore(t, open)
	if _, _, err := s.CreateKey(ctx, "nobody"); errdefs.CodeOf(err) != errdefs.CodeNotFound {
		t.Fatalf("key for an unknown owner: %v, want not_found", err)
	}
	if _, err := s.CreateOwner(ctx, "team-a"); err != nil {
		t.Fatal(err)
	}
	key, rec, err := s.CreateKey(ctx, "team-a")
	if err != nil {
		t.Fatal(err)
	}
	if owner, err := s.Authenticate(ctx, key); err != nil || owner != "team-a" {
		t.Fatalf("Authenticate = %q, %v", owner, err)
	}
	last := byte('A')
	if key[len(key)-1] == 'A' {
		last = 'B'
	}
	for _, bad := range []string{"", "ctl_", key[:len(key)-1] + string(last), key + "x"} {
		if _, err := s.Authenticate(ctx, bad); !errors.Is(err, manager.ErrUnauthenticated) {
			t.Errorf("Authenticate(%q) = %v, want unauthenticated", bad, err)
		}
	}
	if err := s.RevokeKey(ctx, rec.KeyID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(ctx, key); !errors.Is(err, manager.ErrUnauthenticated) {
		t.Fatalf("revoked key: %v", err)
	}
	ks, err := s.Keys(ctx, "team-a")
	if err != nil || len(ks) != 1 || ks[0].RevokedAt == nil {
		t.Fatalf("Keys = %+v, %v", ks, err)
	}
}

// admitConcurrent races 200 admissions of one
// owner against a quota of 7 sandboxes: exactly 7 are recorded.
func admitConcurrent(t *testing.T, open Opener) {
	ctx := context.Background()
	s, _ := newStore(t, open)
	if _, err := s.SetQuota(ctx, "team-a", manager.Quota{Sandboxes: 7, CPUMillis: 100000, MemoryBytes: 1 << 40, DiskBytes: 1 << 40, CreatesPerMin: 1000}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ok, quota int
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := s.AdmitCreate(ctx, manager.Admission{Owner: "team-a", ID: fmt.Sprintf("sb-%03d", i), Spec: []byte("{}"), CPUMillis: 100, Memory: 1 << 20})
			var qe *manager.QuotaError
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case errors.As(err, &qe):
				quota++
			default:
				t.Errorf("admit: %v", err)
			}
		}()
	}
	wg.Wait()
	u, err := s.Usage(ctx, "team-a")
	if err != nil {
		t.Fatal(err)
	}
	if ok != 7 || quota != 193 || u.Sandboxes != 7 || u.CPUMillis != 700 {
		t.Fatalf("admitted %d, refused %d, usage %+v; want 7, 193, 7 sandboxes of 700m", ok, quota, u)
	}
}

func admitQuotaAndRate(t *testing.T, open Opener) {
	ctx := context.Background()
	s, clk := newStore(t, open)
	if _, err := s.SetQuota(ctx, "t", manager.Quota{Sandboxes: 10, CPUMillis: 1000, MemoryBytes: 1 << 30, DiskBytes: 1 << 30, CreatesPerMin: 3}); err != nil {
		t.Fatal(err)
	}
	admit := func(id string, cpu int64) error {
		return s.AdmitCreate(ctx, manager.Admission{Owner: "t", ID: id, Spec: []byte("{}"), CPUMillis: cpu, Memory: 1 << 20})
	}
	var qe *manager.QuotaError
	if err := admit("a", 1001); !errors.As(err, &qe) || qe.Resource != "cpu_millis" {
		t.Fatalf("over cpu: %v", err)
	}
	for _, id := range []string{"a", "b", "c"} {
		if err := admit(id, 100); err != nil {
			t.Fatal(err)
		}
	}
	if err := admit("d", 100); !errors.As(err, &qe) || qe.Resource != "creates per minute" || qe.RetryAfter <= 0 {
		t.Fatalf("over rate: %v", err)
	}
	clk.add(61 * time.Second)
	if err := admit("d", 100); err != nil {
		t.Fatalf("after a minute: %v", err)
	}
	// Ending returns the share.
	if err := s.EndOwnedSandbox(ctx, "a", "destroyed"); err != nil {
		t.Fatal(err)
	}
	if u, _ := s.Usage(ctx, "t"); u.Sandboxes != 3 || u.CPUMillis != 300 {
		t.Fatalf("usage after end: %+v", u)
	}
	if _, err := s.OwnedSandbox(ctx, "other", "b"); errdefs.CodeOf(err) != errdefs.CodeNotFound {
		t.Fatalf("another owner's sandbox: %v, want not_found", err)
	}
}

func timersFireOnce(t *testing.T, open Opener) {
	ctx := context.Background()
	s, clk := newStore(t, open)
	if _, err := s.CreateOwner(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	now := clk.now()
	if err := s.AdmitCreate(ctx, manager.Admission{Owner: "t", ID: "x", Spec: []byte("{}"), Deadline: now.Add(10 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	if due, _ := s.DueTimers(ctx, clk.now(), 10); len(due) != 0 {
		t.Fatalf("due before the deadline: %+v", due)
	}
	if _, err := s.ExtendTimer(ctx, "x", now.Add(20*time.Second)); err != nil {
		t.Fatal(err)
	}
	clk.add(15 * time.Second)
	if due, _ := s.DueTimers(ctx, clk.now(), 10); len(due) != 0 {
		t.Fatalf("due before the extended deadline: %+v", due)
	}
	clk.add(10 * time.Second)
	due, err := s.DueTimers(ctx, clk.now(), 10)
	if err != nil || len(due) != 1 {
		t.Fatalf("due = %+v, %v", due, err)
	}
	if _, ok, err := s.MarkFiring(ctx, "x"); err != nil || !ok {
		t.Fatalf("MarkFiring = %v, %v", ok, err)
	}
	if _, err := s.ExtendTimer(ctx, "x", clk.now().Add(time.Hour)); errdefs.CodeOf(err) != errdefs.CodeConflict {
		t.Fatalf("extending a firing timer: %v, want conflict", err)
	}
	// A firing timer is due again (a restarted manager completes it)...
	if due, _ := s.DueTimers(ctx, clk.now(), 10); len(due) != 1 || due[0].State != "firing" {
		t.Fatalf("firing timer not due again: %+v", due)
	}
	if err := s.FinishTimer(ctx, "x", "op-1", true); err != nil {
		t.Fatal(err)
	}
	// ...and a done one never again.
	if due, _ := s.DueTimers(ctx, clk.now(), 10); len(due) != 0 {
		t.Fatalf("done timer due: %+v", due)
	}
	if _, ok, _ := s.MarkFiring(ctx, "x"); ok {
		t.Fatal("a done timer was marked firing")
	}
	sb, err := s.OwnedSandbox(ctx, "t", "x")
	if err != nil || sb.Active || sb.Reason != "timeout" {
		t.Fatalf("sandbox after its timeout: %+v, %v", sb, err)
	}
}

// timerDueWithinItsSecond: a deadline on a whole second is due half a
// second after it (stored times compare as text: one width for all).
func timerDueWithinItsSecond(t *testing.T, open Opener) {
	ctx := context.Background()
	s, clk := newStore(t, open)
	if _, err := s.CreateOwner(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	if err := s.AdmitCreate(ctx, manager.Admission{Owner: "t", ID: "x", Spec: []byte("{}"), Deadline: clk.now().Add(10 * time.Second), Idle: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	clk.add(10*time.Second + 500*time.Millisecond)
	if due, err := s.DueTimers(ctx, clk.now(), 10); err != nil || len(due) != 1 {
		t.Fatalf("timeout due 0.5 s after its deadline: %+v, %v", due, err)
	}
	if due, err := s.DueIdle(ctx, clk.now(), 10); err != nil || len(due) != 1 {
		t.Fatalf("idle timer due 0.5 s after its deadline: %+v, %v", due, err)
	}
}

func idempotencyRecords(t *testing.T, open Opener) {
	ctx := context.Background()
	s, clk := newStore(t, open)
	if _, created, err := s.BeginIdempotent(ctx, "t", "k1"); err != nil || !created {
		t.Fatalf("first: %v %v", created, err)
	}
	if rec, created, _ := s.BeginIdempotent(ctx, "t", "k1"); created || rec.State != "pending" {
		t.Fatalf("second while pending: %v %+v", created, rec)
	}
	if _, created, _ := s.BeginIdempotent(ctx, "u", "k1"); !created {
		t.Fatal("another owner's same key is not its own")
	}
	if err := s.FinishIdempotent(ctx, "t", "k1", manager.IdempotencyRecord{RequestHash: "h", Status: 201, ContentType: "application/json", Body: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if rec, created, _ := s.BeginIdempotent(ctx, "t", "k1"); created || rec.State != "done" || rec.Status != 201 || rec.RequestHash != "h" {
		t.Fatalf("after finish: %v %+v", created, rec)
	}
	if n, err := s.AbandonPendingIdempotent(ctx); err != nil || n != 1 {
		t.Fatalf("abandon pending = %d, %v (want u/k1 only)", n, err)
	}
	if n, err := s.PruneIdempotent(ctx, clk.now().Add(-time.Hour)); err != nil || n != 0 {
		t.Fatalf("prune of nothing old = %d, %v", n, err)
	}
	if n, err := s.PruneIdempotent(ctx, clk.now().Add(time.Second)); err != nil || n != 1 {
		t.Fatalf("prune = %d, %v", n, err)
	}
	if _, created, _ := s.BeginIdempotent(ctx, "t", "k1"); !created {
		t.Fatal("a pruned key is still kept")
	}
}

// idleTimers: an idle timer is due idle after the last touch (not
// before, at most the slack later); another owner's touch changes
// nothing; a paused sandbox's timer is not due and a resume rearms it; a
// firing timer is due again until finished, and a destroy ends the
// sandbox (reason idle) once.
func idleTimers(t *testing.T, open Opener) {
	ctx := context.Background()
	s, clk := newStore(t, open)
	for _, o := range []string{"t", "u"} {
		if _, err := s.CreateOwner(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	idle := 100 * time.Second
	for _, id := range []string{"x", "y"} {
		if err := s.AdmitCreate(ctx, manager.Admission{Owner: "t", ID: id, Spec: []byte("{}"), Idle: idle, Deadline: clk.now().Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	clk.add(60 * time.Second)
	if err := s.TouchIdle(ctx, "u", "x", clk.now()); err != nil {
		t.Fatal(err)
	}
	if err := s.TouchIdle(ctx, "t", "y", clk.now()); err != nil {
		t.Fatal(err)
	}
	lastTouch := clk.now()
	clk.add(41 * time.Second)
	due, err := s.DueIdle(ctx, clk.now(), 10)
	if err != nil || len(due) != 1 || due[0].SandboxID != "x" || due[0].Idle != idle {
		t.Fatalf("due after 101 s (x untouched but for another owner's touch): %+v, %v", due, err)
	}
	// Touches within the slack write nothing new: y's deadline is
	// idle+slack after its first touch, never sooner than idle after the last.
	if err := s.TouchIdle(ctx, "t", "y", lastTouch.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	yt, err := s.IdleTimer(ctx, "y")
	if err != nil || yt.Deadline.Before(lastTouch.Add(time.Second+idle)) || yt.Deadline.After(lastTouch.Add(idle+manager.IdleSlack(idle))) {
		t.Fatalf("y after touches: %+v, %v", yt, err)
	}
	// x fires: firing is due again until finished; a touch does not stop it.
	if _, ok, err := s.MarkIdleFiring(ctx, "x"); err != nil || !ok {
		t.Fatalf("MarkIdleFiring = %v, %v", ok, err)
	}
	if err := s.TouchIdle(ctx, "t", "x", clk.now()); err != nil {
		t.Fatal(err)
	}
	if due, _ := s.DueIdle(ctx, clk.now(), 10); len(due) != 1 || due[0].State != "firing" {
		t.Fatalf("firing idle timer not due again: %+v", due)
	}
	if err := s.FinishIdle(ctx, "x", "destroy", "op-x", true); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.MarkIdleFiring(ctx, "x"); ok {
		t.Fatal("a done idle timer was marked firing")
	}
	sb, err := s.OwnedSandbox(ctx, "t", "x")
	if err != nil || sb.Active || sb.Reason != "idle" || sb.TimerState != "cancelled" {
		t.Fatalf("sandbox after its idle destroy: %+v, %v", sb, err)
	}
	// y: paused by its idle timer, not due while paused; a resume rearms it.
	clk.add(time.Hour - 2*time.Minute)
	if _, ok, err := s.MarkIdleFiring(ctx, "y"); err != nil || !ok {
		t.Fatalf("MarkIdleFiring(y) = %v, %v", ok, err)
	}
	if err := s.FinishIdle(ctx, "y", "pause", "op-y", false); err != nil {
		t.Fatal(err)
	}
	if sb, err := s.OwnedSandbox(ctx, "t", "y"); err != nil || !sb.Paused || !sb.Active {
		t.Fatalf("y after its idle pause: %+v, %v", sb, err)
	}
	clk.add(time.Minute)
	if due, _ := s.DueIdle(ctx, clk.now(), 10); len(due) != 0 {
		t.Fatalf("due while paused: %+v", due)
	}
	if err := s.SetPaused(ctx, "y", false); err != nil {
		t.Fatal(err)
	}
	if err := s.RearmIdle(ctx, "y", clk.now()); err != nil {
		t.Fatal(err)
	}
	if yt, err := s.IdleTimer(ctx, "y"); err != nil || yt.State != "armed" || !yt.Deadline.Equal(clk.now().Add(idle)) {
		t.Fatalf("y after the resume: %+v, %v", yt, err)
	}
	if due, _ := s.DueIdle(ctx, clk.now().Add(idle-time.Second), 10); len(due) != 0 {
		t.Fatalf("due before idle after the resume: %+v", due)
	}
}

// PairOpener opens a fresh, empty database and returns two handles on it
// (two manager processes' stores).
type PairOpener func(t *testing.T, now func() time.Time) (a, b manager.ServiceStore)

// RunShared runs the cases that need two handles on one database.
func RunShared(t *testing.T, open PairOpener) {
	t.Run("AdmitFromTwoHandlesNeverExceedsQuota", func(t *testing.T) { admitTwoHandles(t, open) })
}

// admitTwoHandles races 300 admissions of two owners from two handles
// (as two replicas would): each owner's sandboxes and CPU never exceed
// its quota, and exactly the quota is admitted.
func admitTwoHandles(t *testing.T, open PairOpener) {
	ctx := context.Background()
	clk := &Clock{t: time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC)}
	a, b := open(t, clk.now)
	quota := map[string]manager.Quota{
		"team-a": {Sandboxes: 9, CPUMillis: 100000, MemoryBytes: 1 << 40, DiskBytes: 1 << 40, CreatesPerMin: 1000},
		"team-b": {Sandboxes: 100, CPUMillis: 1000, MemoryBytes: 1 << 40, DiskBytes: 1 << 40, CreatesPerMin: 1000},
	}
	for o, q := range quota {
		if _, err := a.SetQuota(ctx, o, q); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := map[string]int{}
	start := make(chan struct{})
	for i := range 300 {
		s, owner := a, "team-a"
		if i%2 == 1 {
			s = b
		}
		if i%3 == 0 {
			owner = "team-b"
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			err := s.AdmitCreate(ctx, manager.Admission{Owner: owner, ID: fmt.Sprintf("sb-%03d", i), Spec: []byte("{}"), CPUMillis: 100, Memory: 1 << 20})
			var qe *manager.QuotaError
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				admitted[owner]++
			case errors.As(err, &qe):
			default:
				t.Errorf("admit %d: %v", i, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	for owner, want := range map[string]int64{"team-a": 9, "team-b": 10} {
		u, err := b.Usage(ctx, owner)
		if err != nil {
			t.Fatal(err)
		}
		if int64(admitted[owner]) != want || u.Sandboxes != want || u.CPUMillis != 100*want {
			t.Errorf("%s: admitted %d, usage %+v; want exactly %d sandboxes of 100m (quota %+v)", owner, admitted[owner], u, want, quota[owner])
		}
	}
}
