package manager

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
)

type lockedClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *lockedClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *lockedClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func openServiceStore(t *testing.T) (*Store, *lockedClock, string) {
	t.Helper()
	clk := &lockedClock{t: time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC)}
	path := filepath.Join(t.TempDir(), "manager.db")
	s, err := OpenStore(context.Background(), path, clk.now)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, clk, path
}

func TestKeysStoreOnlyHashes(t *testing.T) {
	ctx := context.Background()
	s, _, path := openServiceStore(t)
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
	if !strings.HasPrefix(key, "ctl_") || len(key) != 47 || !strings.HasPrefix(key[4:], rec.KeyID) {
		t.Fatalf("key %q (id %q): want ctl_ + 43 base64url characters starting with the id", key, rec.KeyID)
	}
	if owner, err := s.Authenticate(ctx, key); err != nil || owner != "team-a" {
		t.Fatalf("Authenticate = %q, %v", owner, err)
	}
	// Same id prefix, different secret: refused.
	last := byte('A')
	if key[len(key)-1] == 'A' {
		last = 'B'
	}
	forged := key[:len(key)-1] + string(last)
	for _, bad := range []string{"", "ctl_", "Bearer " + key, forged, key + "x", strings.ToUpper(key)} {
		if _, err := s.Authenticate(ctx, bad); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("Authenticate(%q) = %v, want unauthenticated", bad, err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{path, path + "-wal"} {
		b, err := os.ReadFile(f)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		if strings.Contains(string(b), key) || strings.Contains(string(b), key[len("ctl_")+keyIDLen:]) {
			t.Fatalf("%s holds the key's secret", f)
		}
	}
	s2, err := OpenStore(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if err := s2.RevokeKey(ctx, rec.KeyID); err != nil {
		t.Fatal(err)
	}
	if _, err := s2.Authenticate(ctx, key); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("revoked key: %v", err)
	}
	keys, err := s2.Keys(ctx, "team-a")
	if err != nil || len(keys) != 1 || keys[0].RevokedAt == nil {
		t.Fatalf("Keys = %+v, %v", keys, err)
	}
}

// TestAdmitCreateConcurrentNeverExceedsQuota races 200 admissions of one
// owner against a quota of 7 sandboxes: exactly 7 are recorded.
func TestAdmitCreateConcurrentNeverExceedsQuota(t *testing.T) {
	ctx := context.Background()
	s, _, _ := openServiceStore(t)
	if _, err := s.SetQuota(ctx, "team-a", Quota{Sandboxes: 7, CPUMillis: 100000, MemoryBytes: 1 << 40, DiskBytes: 1 << 40, CreatesPerMin: 1000}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ok, quota int
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := s.AdmitCreate(ctx, Admission{Owner: "team-a", ID: fmt.Sprintf("sb-%03d", i), Spec: []byte("{}"), CPUMillis: 100, Memory: 1 << 20})
			var qe *QuotaError
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

func TestAdmitCreateQuotaAndRate(t *testing.T) {
	ctx := context.Background()
	s, clk, _ := openServiceStore(t)
	if _, err := s.SetQuota(ctx, "t", Quota{Sandboxes: 10, CPUMillis: 1000, MemoryBytes: 1 << 30, DiskBytes: 1 << 30, CreatesPerMin: 3}); err != nil {
		t.Fatal(err)
	}
	admit := func(id string, cpu int64) error {
		return s.AdmitCreate(ctx, Admission{Owner: "t", ID: id, Spec: []byte("{}"), CPUMillis: cpu, Memory: 1 << 20})
	}
	var qe *QuotaError
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

func TestTimersFireOnceAndSurviveRestart(t *testing.T) {
	ctx := context.Background()
	s, clk, _ := openServiceStore(t)
	if _, err := s.CreateOwner(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	now := clk.now()
	if err := s.AdmitCreate(ctx, Admission{Owner: "t", ID: "x", Spec: []byte("{}"), Deadline: now.Add(10 * time.Second)}); err != nil {
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

func TestIdempotencyRecords(t *testing.T) {
	ctx := context.Background()
	s, _, _ := openServiceStore(t)
	if _, created, err := s.BeginIdempotent(ctx, "t", "k1"); err != nil || !created {
		t.Fatalf("first: %v %v", created, err)
	}
	if rec, created, _ := s.BeginIdempotent(ctx, "t", "k1"); created || rec.State != "pending" {
		t.Fatalf("second while pending: %v %+v", created, rec)
	}
	if _, created, _ := s.BeginIdempotent(ctx, "u", "k1"); !created {
		t.Fatal("another owner's same key is not its own")
	}
	if err := s.FinishIdempotent(ctx, "t", "k1", IdempotencyRecord{RequestHash: "h", Status: 201, ContentType: "application/json", Body: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if rec, created, _ := s.BeginIdempotent(ctx, "t", "k1"); created || rec.State != "done" || rec.Status != 201 || rec.RequestHash != "h" {
		t.Fatalf("after finish: %v %+v", created, rec)
	}
	if n, err := s.AbandonPendingIdempotent(ctx); err != nil || n != 1 {
		t.Fatalf("abandon pending = %d, %v (want u/k1 only)", n, err)
	}
	if n, err := s.PruneIdempotent(ctx, s.now().Add(-time.Hour)); err != nil || n != 0 {
		t.Fatalf("prune of nothing old = %d, %v", n, err)
	}
	if n, err := s.PruneIdempotent(ctx, s.now().Add(time.Second)); err != nil || n != 1 {
		t.Fatalf("prune = %d, %v", n, err)
	}
	if _, created, _ := s.BeginIdempotent(ctx, "t", "k1"); !created {
		t.Fatal("a pruned key is still kept")
	}
}
