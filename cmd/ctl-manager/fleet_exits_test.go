package main

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/pgtest"
)

// fleetReplicas starts n `serve --fleet` replicas on f's database (no
// ctld of their own) and returns a client of the owner team-a to each.
func (f *fleetEnv) fleetReplicas(t *testing.T, n int, extra ...string) ([]*client.Client, []*serveChild) {
	e := f.env
	key := strings.TrimSpace(e.ok("key", "create", "--owner", "team-a"))
	e.ok("owner", "quota", "set", "team-a", "--sandboxes", "100", "--cpu", "100", "--memory", "100Gi", "--creates-per-min", "100000")
	e.socket = "/nonexistent/ctld.sock"
	args := append([]string{"--fleet", "--template", "busybox", "--default-timeout", "0", "--lease-ttl", "1s"}, channelArgs(f.ca.Issue(t, "manager", false))...)
	var cs []*client.Client
	var ps []*serveChild
	for i := range n {
		p := e.startServeChild("127.0.0.1:0", append(append(args, "--replica-id", string(rune('a'+i))), extra...)...)
		cs = append(cs, &client.Client{BaseURL: "http://" + p.addr, Key: key})
		ps = append(ps, p)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for i, p := range ps {
				t.Logf("replica %d:\n%s", i, p.stderr())
			}
			t.Logf("%s", f.logs())
		}
	})
	return cs, ps
}

// waitSandbox polls GET until ok says yes (20 s at most).
func waitSandbox(t *testing.T, c *client.Client, id string, ok func(client.Sandbox) bool) client.Sandbox {
	t.Helper()
	var sb client.Sandbox
	var err error
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if sb, err = c.Get(context.Background(), id); err == nil && ok(sb) {
			return sb
		}
	}
	t.Fatalf("sandbox %s: %+v, %v (waited 20s)", id, sb, err)
	return sb
}

// TestServeFleetOnExitOnPostgres: under `serve --fleet` (two replicas, a
// node process next to a fake ctld, a real PostgreSQL) a guest's exit on
// the node reaches the service: the node process records it in the
// database, an on_exit keep sandbox shows state exited with its code, an
// on_exit destroy sandbox is destroyed through its node (released on
// ctld, the proof verified against the node's pinned key, its
// reservation back), and each exit is one "exited" event across both
// replicas.
func TestServeFleetOnExitOnPostgres(t *testing.T) {
	srv := pgtest.Start(t)
	f := newFleetEnv(t, srv, []string{"node-a"}, "--max-sandboxes", "4", "--poll", "100ms")
	cs, _ := f.fleetReplicas(t, 2)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var events []client.Event
	for _, c := range cs {
		go c.EventsAfter(ctx, "", 0, func(ev client.Event) error {
			mu.Lock()
			events = append(events, ev)
			mu.Unlock()
			return nil
		})
	}

	keep, err := cs[0].Create(ctx, client.CreateRequest{Template: "busybox", OnExit: client.OnExitKeep})
	if err != nil {
		t.Fatal(err)
	}
	gone, err := cs[1].Create(ctx, client.CreateRequest{Template: "busybox", OnExit: client.OnExitDestroy})
	if err != nil {
		t.Fatalf("create on_exit destroy under --fleet: %v", err)
	}
	n := f.nodes["node-a"]
	start := time.Now()
	if err := n.Exit(keep.ID, 7); err != nil {
		t.Fatal(err)
	}
	if err := n.Exit(gone.ID, 3); err != nil {
		t.Fatal(err)
	}
	sb := waitSandbox(t, cs[1], keep.ID, func(sb client.Sandbox) bool { return sb.State == client.StateExited })
	if sb.Exit == nil || sb.Exit.Kind != api.ExitNormal || sb.Exit.Code != 7 {
		t.Fatalf("kept sandbox: %+v exit %+v, want exit code 7", sb, sb.Exit)
	}
	// The reason is recorded just after the node's release.
	sb = waitSandbox(t, cs[0], gone.ID, func(sb client.Sandbox) bool { return sb.State == client.StateDestroyed && sb.Reason != "" })
	if sb.Exit == nil || sb.Exit.Code != 3 || sb.Reason != "exited: code 3" {
		t.Fatalf("destroyed on exit: %+v exit %+v", sb, sb.Exit)
	}
	t.Logf("exits seen and the on_exit destroy done in %v", time.Since(start).Round(time.Millisecond))
	if got, err := n.Get(ctx, gone.ID); err != nil || got.State != api.StateReleased {
		t.Fatalf("on the node the destroyed sandbox is %+v, %v; want released", got, err)
	}
	pc, err := pgx.Connect(ctx, f.db)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close(ctx)
	var verified, releases, reserved, active int
	if err := pc.QueryRow(ctx, `SELECT (SELECT count(*) FROM proofs WHERE sandbox_id = $1 AND verified = 1),
		(SELECT count(*) FROM operations WHERE sandbox_id = $1 AND kind = 'release'),
		(SELECT reserved_sandboxes FROM nodes WHERE node_id = 'node-a'),
		(SELECT count(*) FROM reservations WHERE released_at IS NULL)`, gone.ID).Scan(&verified, &releases, &reserved, &active); err != nil {
		t.Fatal(err)
	}
	if verified != 1 || releases != 1 || reserved != 1 || active != 1 {
		t.Fatalf("after the destroy on exit: %d verified proofs, %d releases, node reserves %d sandboxes, %d active reservations; want 1, 1, 1 (the kept one), 1",
			verified, releases, reserved, active)
	}
	time.Sleep(time.Second) // a second exited event would come within the replicas' ticks
	mu.Lock()
	defer mu.Unlock()
	exited := map[string][]string{}
	var destroyed int
	for _, ev := range events {
		switch {
		case ev.Type == client.EventExited:
			exited[ev.SandboxID] = append(exited[ev.SandboxID], ev.Reason)
		case ev.Type == client.EventDestroyed && ev.SandboxID == gone.ID:
			destroyed++
		}
	}
	// Each replica's follower sees each event once: 2 followers.
	if len(exited[keep.ID]) != 2 || exited[keep.ID][0] != "exited: code 7" || len(exited[gone.ID]) != 2 || exited[gone.ID][0] != "exited: code 3" || destroyed != 2 {
		t.Fatalf("events: exited %v, destroyed %d; want one exited per sandbox and one destroyed seen by each of 2 followers", exited, destroyed)
	}
}
