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
		{"Volumes", volumes},
		{"Events", events},
		{"FailedSandboxSaysWhy", failedSaysWhy},
		{"AdmitWithLease", admitWithLease},
		{"ExitCandidates", exitCandidates},
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
// (as two replicas would), each with its create's operation lease: each
// owner's sandboxes and CPU never exceed its quota, exactly the quota is
// admitted, and no admission was aborted and run again (PostgreSQL:
// admissions of one owner wait for its row's lock instead; under
// SERIALIZABLE they aborted each other, and the 3-node scale test's 20
// clients gave up after 50 reruns under TCG).
func admitTwoHandles(t *testing.T, open PairOpener) {
	ctx := context.Background()
	clk := &Clock{t: time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC)}
	a, b := open(t, clk.now)
	type rerunner interface{ Reruns() uint64 }
	ra, okA := a.(rerunner)
	rb, okB := b.(rerunner)
	if !okA || !okB {
		t.Fatalf("%T does not count its reruns", a)
	}
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
			id := fmt.Sprintf("sb-%03d", i)
			err := s.AdmitCreate(ctx, manager.Admission{Owner: owner, ID: id, Spec: []byte("{}"), CPUMillis: 100, Memory: 1 << 20,
				Lease: &manager.OpLease{ID: "create/" + id, Kind: "create", SandboxID: id, Owner: owner, Holder: fmt.Sprintf("r-%d", i%2)}, LeaseTTL: time.Minute})
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
	before := ra.Reruns() + rb.Reruns()
	close(start)
	wg.Wait()
	if n := ra.Reruns() + rb.Reruns() - before; n != 0 {
		t.Errorf("%d admissions were aborted and run again; want none", n)
	}
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

// volumes: a volume is its owner's only, counts against the disk quota
// until deleted, is held by one active sandbox at a time, and cannot be
// deleted while held.
func volumes(t *testing.T, open Opener) {
	ctx := context.Background()
	s, _ := newStore(t, open)
	for _, o := range []string{"a", "b"} {
		if _, err := s.SetQuota(ctx, o, manager.Quota{Sandboxes: 10, CPUMillis: 10000, MemoryBytes: 1 << 30, DiskBytes: 3 << 20, CreatesPerMin: 100}); err != nil {
			t.Fatal(err)
		}
	}
	var qe *manager.QuotaError
	if err := s.AdmitVolume(ctx, manager.VolumeAdmission{Owner: "a", ID: "vol-big", Size: 4 << 20}); !errors.As(err, &qe) || qe.Resource != "disk_bytes" {
		t.Fatalf("a volume over the disk quota: %v", err)
	}
	if err := s.AdmitVolume(ctx, manager.VolumeAdmission{Owner: "a", ID: "vol-1", Size: 2 << 20, Labels: map[string]string{"k": "v"}}); err != nil {
		t.Fatal(err)
	}
	if u, _ := s.Usage(ctx, "a"); u.Volumes != 1 || u.DiskBytes != 2<<20 {
		t.Fatalf("usage with a volume being created: %+v", u)
	}
	// A sandbox's disk and the volumes share the quota.
	if err := s.AdmitCreate(ctx, manager.Admission{Owner: "a", ID: "sb-disk", Spec: []byte("{}"), Disk: 2 << 20}); !errors.As(err, &qe) || qe.Resource != "disk_bytes" {
		t.Fatalf("a sandbox disk over what the volume left: %v", err)
	}
	if un, err := s.UnsettledVolumes(ctx); err != nil || len(un) != 1 || un[0].ID != "vol-1" || un[0].State != manager.VolumeCreating {
		t.Fatalf("unsettled volumes: %+v, %v", un, err)
	}
	// Not ready: no sandbox may hold it, nor may it be deleted.
	if err := s.AdmitCreate(ctx, manager.Admission{Owner: "a", ID: "sb-0", Spec: []byte("{}"), Volumes: []string{"vol-1"}}); errdefs.CodeOf(err) != errdefs.CodeConflict {
		t.Fatalf("a sandbox on a volume being created: %v", err)
	}
	if _, err := s.BeginVolumeDelete(ctx, "a", "vol-1"); errdefs.CodeOf(err) != errdefs.CodeConflict {
		t.Fatalf("delete of a volume being created: %v", err)
	}
	if err := s.SettleVolume(ctx, "vol-1", true, ""); err != nil {
		t.Fatal(err)
	}
	v, err := s.OwnedVolume(ctx, "a", "vol-1")
	if err != nil || v.State != manager.VolumeReady || v.Size != 2<<20 || v.Labels["k"] != "v" || v.HeldBy != "" {
		t.Fatalf("volume: %+v, %v", v, err)
	}
	// Another owner sees nothing of it, and cannot attach or delete it.
	if _, err := s.OwnedVolume(ctx, "b", "vol-1"); errdefs.CodeOf(err) != errdefs.CodeNotFound {
		t.Fatalf("another owner's volume: %v", err)
	}
	if l, err := s.OwnedVolumes(ctx, "b", "", 10); err != nil || len(l) != 0 {
		t.Fatalf("another owner's list: %+v, %v", l, err)
	}
	if err := s.AdmitCreate(ctx, manager.Admission{Owner: "b", ID: "sb-b", Spec: []byte("{}"), Volumes: []string{"vol-1"}}); errdefs.CodeOf(err) != errdefs.CodeNotFound {
		t.Fatalf("a sandbox of b on a's volume: %v", err)
	}
	if _, err := s.OwnedSandbox(ctx, "b", "sb-b"); errdefs.CodeOf(err) != errdefs.CodeNotFound {
		t.Fatalf("the refused sandbox was recorded: %v", err)
	}
	if _, err := s.BeginVolumeDelete(ctx, "b", "vol-1"); errdefs.CodeOf(err) != errdefs.CodeNotFound {
		t.Fatalf("b deleting a's volume: %v", err)
	}
	// Held by one active sandbox at a time; not deleted while held.
	if err := s.AdmitCreate(ctx, manager.Admission{Owner: "a", ID: "sb-1", Spec: []byte("{}"), Volumes: []string{"vol-1"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.AdmitCreate(ctx, manager.Admission{Owner: "a", ID: "sb-2", Spec: []byte("{}"), Volumes: []string{"vol-1"}}); errdefs.CodeOf(err) != errdefs.CodeConflict {
		t.Fatalf("a second sandbox on a held volume: %v", err)
	}
	if _, err := s.BeginVolumeDelete(ctx, "a", "vol-1"); errdefs.CodeOf(err) != errdefs.CodeConflict {
		t.Fatalf("delete of a held volume: %v", err)
	}
	if v, _ := s.OwnedVolume(ctx, "a", "vol-1"); v.HeldBy != "sb-1" {
		t.Fatalf("held by %q, want sb-1", v.HeldBy)
	}
	if err := s.EndOwnedSandbox(ctx, "sb-1", "destroyed"); err != nil {
		t.Fatal(err)
	}
	if v, err = s.BeginVolumeDelete(ctx, "a", "vol-1"); err != nil || v.State != manager.VolumeDeleting {
		t.Fatalf("delete after the sandbox ended: %+v, %v", v, err)
	}
	if err := s.AdmitCreate(ctx, manager.Admission{Owner: "a", ID: "sb-3", Spec: []byte("{}"), Volumes: []string{"vol-1"}}); errdefs.CodeOf(err) != errdefs.CodeConflict {
		t.Fatalf("a sandbox on a volume being deleted: %v", err)
	}
	if err := s.FinishVolumeDelete(ctx, "vol-1"); err != nil {
		t.Fatal(err)
	}
	if v, err = s.BeginVolumeDelete(ctx, "a", "vol-1"); err != nil || v.State != manager.VolumeDeleted || v.EndedAt == nil {
		t.Fatalf("delete again: %+v, %v", v, err)
	}
	if u, _ := s.Usage(ctx, "a"); u.Volumes != 0 || u.DiskBytes != 0 {
		t.Fatalf("usage after the delete: %+v", u)
	}
	if err := s.AdmitCreate(ctx, manager.Admission{Owner: "a", ID: "sb-4", Spec: []byte("{}"), Volumes: []string{"vol-1"}}); errdefs.CodeOf(err) != errdefs.CodeNotFound {
		t.Fatalf("a sandbox on a deleted volume: %v", err)
	}
	// A failed create gives its share back.
	if err := s.AdmitVolume(ctx, manager.VolumeAdmission{Owner: "a", ID: "vol-2", Size: 3 << 20}); err != nil {
		t.Fatal(err)
	}
	if err := s.SettleVolume(ctx, "vol-2", false, "mkfs failed"); err != nil {
		t.Fatal(err)
	}
	if v, _ := s.OwnedVolume(ctx, "a", "vol-2"); v.State != manager.VolumeFailed || v.Reason != "mkfs failed" {
		t.Fatalf("failed volume: %+v", v)
	}
	if l, err := s.OwnedVolumes(ctx, "a", "", 10); err != nil || len(l) != 2 || l[0].ID != "vol-1" || l[1].ID != "vol-2" {
		t.Fatalf("list: %+v, %v", l, err)
	}
	if un, err := s.UnsettledVolumes(ctx); err != nil || len(un) != 0 {
		t.Fatalf("unsettled after all settled: %+v, %v", un, err)
	}
}

// events: journaled in order with growing sequence numbers, read after a
// cursor per owner (and sandbox), pruned by age.
func events(t *testing.T, open Opener) {
	ctx := context.Background()
	s, clk := newStore(t, open)
	var seqs []int64
	for i, ev := range []manager.ServiceEvent{
		{Owner: "a", SandboxID: "sb-1", Type: "created"},
		{Owner: "b", SandboxID: "sb-2", Type: "created"},
		{Owner: "a", SandboxID: "sb-1", Type: "ready"},
		{Owner: "a", SandboxID: "sb-3", Type: "failed", Reason: "create failed: x"},
	} {
		got, err := s.AppendEvent(ctx, ev)
		if err != nil {
			t.Fatal(err)
		}
		if got.Seq <= 0 || (i > 0 && got.Seq <= seqs[i-1]) || got.Time.IsZero() {
			t.Fatalf("event %d: %+v", i, got)
		}
		seqs = append(seqs, got.Seq)
		clk.add(time.Minute)
	}
	all, err := s.Events(ctx, "a", "", 0, 10)
	if err != nil || len(all) != 3 || all[0].Seq != seqs[0] || all[1].Type != "ready" || all[2].Reason != "create failed: x" {
		t.Fatalf("a's events: %+v, %v", all, err)
	}
	if after, err := s.Events(ctx, "a", "", seqs[0], 10); err != nil || len(after) != 2 || after[0].Seq != seqs[2] {
		t.Fatalf("a's events after %d: %+v, %v", seqs[0], after, err)
	}
	if one, err := s.Events(ctx, "a", "sb-1", 0, 10); err != nil || len(one) != 2 {
		t.Fatalf("sb-1's events: %+v, %v", one, err)
	}
	if page, err := s.Events(ctx, "a", "", 0, 1); err != nil || len(page) != 1 {
		t.Fatalf("a page of 1: %+v, %v", page, err)
	}
	if b, err := s.Events(ctx, "b", "", 0, 10); err != nil || len(b) != 1 || b[0].SandboxID != "sb-2" {
		t.Fatalf("b's events: %+v, %v", b, err)
	}
	if n, err := s.PruneEvents(ctx, all[1].Time); err != nil || n != 2 {
		t.Fatalf("prune: %d, %v; want the 2 events before the third", n, err)
	}
	if rest, err := s.Events(ctx, "a", "", 0, 10); err != nil || len(rest) != 2 || rest[0].Seq != seqs[2] {
		t.Fatalf("after the prune: %+v, %v", rest, err)
	}
	// Sequence numbers never go back, even after the newest is pruned.
	if _, err := s.PruneEvents(ctx, clk.now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if ev, err := s.AppendEvent(ctx, manager.ServiceEvent{Owner: "a", SandboxID: "sb-1", Type: "destroyed"}); err != nil || ev.Seq <= seqs[3] {
		t.Fatalf("after pruning all: %+v, %v", ev, err)
	}
}
