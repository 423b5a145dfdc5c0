package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/pgtest"
)

// retried runs call (one try on the replica it is given) until it
// answers something other than "come back later": a transport error (its
// replica died), 503 unavailable or a 409 with Retry-After (the first
// call with the key still runs). Each try goes to the next replica.
// seen counts the retryable answers by kind.
func retried[T any](ctx context.Context, t *testing.T, cs []*client.Client, first int, seen *sync.Map, call func(c *client.Client) (T, error)) (T, error) {
	deadline := time.Now().Add(60 * time.Second)
	for i := first; ; i++ {
		out, err := call(cs[i%len(cs)])
		var ce *client.Error
		switch {
		case err == nil:
			return out, nil
		case !errors.As(err, &ce):
			seen.Store("transport", true)
		case ce.Code == client.CodeUnavailable && ce.RetryAfter >= time.Second:
			seen.Store("unavailable+retry-after", true)
		case ce.Code == client.CodeConflict && ce.RetryAfter > 0:
			seen.Store("pending", true)
		default:
			return out, err
		}
		if time.Now().After(deadline) {
			return out, fmt.Errorf("still retryable after 60s: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// load runs workers that each create and destroy sandboxes through the
// replicas in cs (every call with an Idempotency-Key, retried with the
// same key on failure): the ids each create answered, by worker.
func load(ctx context.Context, t *testing.T, cs []*client.Client, prefix string, workers, rounds int, seen *sync.Map) []string {
	var mu sync.Mutex
	var ids []string
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				key := fmt.Sprintf("%s-%d-%d", prefix, w, i)
				sb, err := retried(ctx, t, cs, w+i, seen, func(c *client.Client) (client.Sandbox, error) {
					return c.Create(ctx, client.CreateRequest{Template: "busybox", Labels: map[string]string{"load": prefix}}, client.IdempotencyKey("c-"+key))
				})
				if err != nil || sb.State != client.StateReady {
					t.Errorf("create %s: %+v, %v", key, sb, err)
					return
				}
				mu.Lock()
				ids = append(ids, sb.ID)
				mu.Unlock()
				d, err := retried(ctx, t, cs, w+i+1, seen, func(c *client.Client) (client.DestroyResult, error) {
					return c.Destroy(ctx, sb.ID, client.IdempotencyKey("d-"+key))
				})
				if err != nil || !d.Proof.Verified || d.Sandbox.State != client.StateDestroyed {
					t.Errorf("destroy %s (%s): %+v, %v", key, sb.ID, d, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return ids
}

// TestServeReplicasOnPostgres: two `ctl-manager serve` processes on one
// real PostgreSQL, a real client calling both, a fake node over ctld's
// socket API. Replica A is SIGKILLed while the node holds a create it
// sent (done on the node, answer held) and a destroy (not yet done), and
// while workers create and destroy through both. Replica B takes over
// A's operations once A's leases expire: the create's and the destroy's
// retries with their Idempotency-Keys get the finished operations'
// answers, every worker's calls complete, and everything happened once:
// one claim operation per sandbox (each at generation 1 on the node),
// one release per destroyed sandbox, no duplicate sandbox, nothing left
// pending in the database. Then the database is restarted under load:
// calls answer 503 with Retry-After meanwhile, and everything completes
// after, again exactly once.
func TestServeReplicasOnPostgres(t *testing.T) {
	srv := pgtest.Start(t)
	e := newEnv(t)
	e.db = srv.NewDatabase(t)
	key := strings.TrimSpace(e.ok("key", "create", "--owner", "team-a"))
	e.ok("owner", "quota", "set", "team-a", "--sandboxes", "1000", "--cpu", "1000", "--memory", "1000Gi", "--creates-per-min", "100000")
	ctx := context.Background()
	args := []string{"--template", "busybox", "--default-timeout", "0", "--lease-ttl", "1s"}
	a := e.startServeChild("127.0.0.1:0", append(args, "--replica-id", "replica-a")...)
	b := e.startServeChild("127.0.0.1:0", append(args, "--replica-id", "replica-b")...)
	ca := &client.Client{BaseURL: "http://" + a.addr, Key: key}
	cb := &client.Client{BaseURL: "http://" + b.addr, Key: key}
	both := []*client.Client{ca, cb}
	seen := &sync.Map{}

	// X: made through A, destroyed through A below while A dies.
	x, err := ca.Create(ctx, client.CreateRequest{Template: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	created := newGate("claim", true)
	released := newGate("release", false)
	e.node.Lock()
	e.node.Hold = func(kind, id string, after bool) error {
		if err := created.hold(kind, id, after); err != nil {
			return err
		}
		return released.hold(kind, id, after)
	}
	e.node.Unlock()
	createDone := make(chan error, 1)
	go func() {
		_, err := ca.Create(ctx, client.CreateRequest{Template: "busybox"}, client.IdempotencyKey("held-create"))
		createDone <- err
	}()
	heldID := <-created.arrived
	destroyDone := make(chan error, 1)
	go func() {
		_, err := ca.Destroy(ctx, x.ID, client.IdempotencyKey("held-destroy"))
		destroyDone <- err
	}()
	if id := <-released.arrived; id != x.ID {
		t.Fatalf("held release of %s, want %s", id, x.ID)
	}
	loadDone := make(chan []string, 1)
	go func() { loadDone <- load(ctx, t, both, "kill", 6, 5, seen) }()
	time.Sleep(300 * time.Millisecond)
	a.kill()
	killed := time.Now()
	created.release <- nil  // done on the node; its answer goes nowhere
	released.release <- nil // carried out after its caller died
	for what, ch := range map[string]chan error{"create": createDone, "destroy": destroyDone} {
		if err := <-ch; err == nil {
			t.Fatalf("the held %s answered although its replica was killed", what)
		}
	}
	// The callers retry through B with their keys: the answers of the
	// operations B took over.
	sb, err := retried(ctx, t, []*client.Client{cb}, 0, seen, func(c *client.Client) (client.Sandbox, error) {
		return c.Create(ctx, client.CreateRequest{Template: "busybox"}, client.IdempotencyKey("held-create"))
	})
	if err != nil || sb.ID != heldID || sb.State != client.StateReady {
		t.Fatalf("retried held create: %+v, %v; want %s ready", sb, err, heldID)
	}
	t.Logf("the held create's answer through B %v after A's kill (lease TTL 1s)", time.Since(killed).Round(time.Millisecond))
	d, err := retried(ctx, t, []*client.Client{cb}, 0, seen, func(c *client.Client) (client.DestroyResult, error) {
		return c.Destroy(ctx, x.ID, client.IdempotencyKey("held-destroy"))
	})
	if err != nil || !d.Proof.Verified || !d.Proof.Clean || d.Sandbox.State != client.StateDestroyed {
		t.Fatalf("retried held destroy: %+v, %v", d, err)
	}
	ids := <-loadDone
	if t.Failed() {
		t.Fatalf("B's log:\n%s", b.stderr())
	}
	want := append([]string{x.ID, heldID}, ids...)
	checkOnce(t, e, want, []string{heldID})
	if !strings.Contains(b.stderr(), "taking over an operation") {
		t.Fatalf("B took nothing over:\n%s", b.stderr())
	}
	t.Logf("after the kill: %d sandboxes made and %d destroyed exactly once; retryable answers seen: %v", len(want), len(want)-1, keys(seen))

	// The database restarted under load (A back as a new process).
	a = e.startServeChild("127.0.0.1:0", append(args, "--replica-id", "replica-a")...)
	ca = &client.Client{BaseURL: "http://" + a.addr, Key: key}
	both = []*client.Client{ca, cb}
	seen = &sync.Map{}
	go func() { loadDone <- load(ctx, t, both, "restart", 6, 5, seen) }()
	time.Sleep(300 * time.Millisecond)
	srv.Stop(t)
	// While it is down: 503 with a retry hint, from both replicas.
	for _, c := range both {
		var ce *client.Error
		if _, err := c.Create(ctx, client.CreateRequest{Template: "busybox"}); !errors.As(err, &ce) || ce.Status != 503 || ce.Code != client.CodeUnavailable || ce.RetryAfter < time.Second {
			t.Errorf("create while the database is down: %v, want 503 unavailable with Retry-After", err)
		}
	}
	time.Sleep(2 * time.Second)
	srv.Restart(t)
	ids = <-loadDone
	if t.Failed() {
		t.Fatalf("A's log:\n%s\nB's log:\n%s", a.stderr(), b.stderr())
	}
	if _, ok := seen.Load("unavailable+retry-after"); !ok {
		t.Fatalf("no call of the load saw 503 with Retry-After while the database was down: %v", keys(seen))
	}
	want = append(want, ids...)
	checkOnce(t, e, want, []string{heldID})
	t.Logf("after the database restart: %d sandboxes in all, each made once; retryable answers seen: %v", len(want), keys(seen))
}

func keys(m *sync.Map) []string {
	var out []string
	m.Range(func(k, _ any) bool { out = append(out, k.(string)); return true })
	return out
}

// checkOnce checks, once the replicas settled (within 20s), that the
// database and the node agree that each of want was made once and each
// but live was destroyed once, and that nothing is left pending.
func checkOnce(t *testing.T, e *env, want, live []string) {
	t.Helper()
	ctx := context.Background()
	seen := map[string]bool{}
	for _, id := range want {
		if seen[id] {
			t.Fatalf("sandbox %s answered to two creates", id)
		}
		seen[id] = true
	}
	pc, err := pgx.Connect(ctx, e.db)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close(ctx)
	var owned, active, unsettled, leases, pendingOps, pendingKeys int
	for deadline := time.Now().Add(20 * time.Second); ; {
		err := pc.QueryRow(ctx, `SELECT (SELECT count(*) FROM owned_sandboxes), (SELECT count(*) FROM owned_sandboxes WHERE active = 1),
			(SELECT count(*) FROM owned_sandboxes o LEFT JOIN sandboxes s ON s.id = o.id WHERE o.active = 1 AND (s.state IS NULL OR s.state <> 'ready')),
			(SELECT count(*) FROM op_leases), (SELECT count(*) FROM operations WHERE state = 'pending'), (SELECT count(*) FROM idempotency WHERE state = 'pending')`).
			Scan(&owned, &active, &unsettled, &leases, &pendingOps, &pendingKeys)
		if err == nil && owned == len(want) && active == len(live) && unsettled == 0 && leases == 0 && pendingOps == 0 && pendingKeys == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("database: %d sandboxes (want %d), %d active (want %d), %d unsettled, %d leases, %d pending operations, %d pending keys (want 0 each); %v",
				owned, len(want), active, len(live), unsettled, leases, pendingOps, pendingKeys, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var gens, claimOps int
	if err := pc.QueryRow(ctx, `SELECT (SELECT count(*) FROM generations), (SELECT count(*) FROM operations WHERE kind = 'claim')`).Scan(&gens, &claimOps); err != nil {
		t.Fatal(err)
	}
	if gens != len(want) || claimOps != len(want) {
		t.Fatalf("database: %d generations, %d claim operations; want one each per sandbox (%d)", gens, claimOps, len(want))
	}
	e.node.Lock()
	claims, releases := distinct(e.node.ClaimOps), distinct(e.node.ReleaseOps)
	e.node.Unlock()
	if claims != len(want) || releases != len(want)-len(live) {
		t.Fatalf("node: %d distinct claim operations, %d distinct releases; want %d and %d", claims, releases, len(want), len(want)-len(live))
	}
	list, err := e.node.List(ctx)
	if err != nil || len(list.Sandboxes) != len(want) {
		t.Fatalf("node sandboxes: %d, %v; want %d", len(list.Sandboxes), err, len(want))
	}
	isLive := map[string]bool{}
	for _, id := range live {
		isLive[id] = true
	}
	for _, sb := range list.Sandboxes {
		if !seen[sb.ID] || sb.Generation != 1 {
			t.Fatalf("node sandbox %s at generation %d: unknown or claimed twice", sb.ID, sb.Generation)
		}
		if wantState := map[bool]string{true: "ready", false: "released"}[isLive[sb.ID]]; string(sb.State) != wantState {
			t.Fatalf("node sandbox %s is %s, want %s", sb.ID, sb.State, wantState)
		}
	}
}
