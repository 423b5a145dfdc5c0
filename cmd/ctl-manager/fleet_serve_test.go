package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/manager"
	"github.com/ctld/ctld/internal/manager/fakenode"
	"github.com/ctld/ctld/internal/nodechannel"
	"github.com/ctld/ctld/internal/nodechannel/channeltest"
	"github.com/ctld/ctld/internal/pgtest"
	"github.com/ctld/ctld/internal/testutil"
)

// startChild runs `ctl-manager ARGS` as a child process (as
// startServeChild, for commands that print no address).
func (e *env) startChild(args ...string) *serveChild {
	e.t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "CTL_MANAGER_TEST_CHILD=1")
	c := &serveChild{t: e.t, cmd: cmd, log: &testutil.Buffer{}}
	cmd.Stderr = c.log
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		if c.cmd.ProcessState == nil {
			c.cmd.Process.Kill()
			c.cmd.Wait()
		}
	})
	return c
}

func channelArgs(f nodechannel.Files) []string {
	return []string{"--cluster-ca", f.CA, "--channel-cert", f.Cert, "--channel-key", f.Key}
}

// fleetEnv is a fleet on one real PostgreSQL: fake ctlds, each with a
// `node run` child process serving its node channel.
type fleetEnv struct {
	*env
	ca    *channeltest.CA
	nodes map[string]*fakenode.Node
	procs map[string]*serveChild
	args  map[string][]string // each node process's arguments
}

// restartNode kills node id's process (SIGKILL) and starts it again.
func (f *fleetEnv) restartNode(id string) {
	f.procs[id].kill()
	f.procs[id] = f.startChild(f.args[id]...)
}

func newFleetEnv(t *testing.T, srv *pgtest.Server, nodeIDs []string, nodeArgs ...string) *fleetEnv {
	e := newEnv(t)
	e.db = srv.NewDatabase(t)
	f := &fleetEnv{env: e, ca: channeltest.NewCA(t, "cluster"), nodes: map[string]*fakenode.Node{}, procs: map[string]*serveChild{}, args: map[string][]string{}}
	for _, id := range nodeIDs {
		f.nodes[id] = fakenode.New(id)
		socket := fakenode.Serve(t, f.nodes[id])
		args := append([]string{"--socket", socket, "--db", e.db, "node", "run", "--template", "busybox",
			"--channel-listen", "127.0.0.1:0"}, channelArgs(f.ca.Issue(t, id, true))...)
		f.args[id] = append(args, nodeArgs...)
		f.procs[id] = e.startChild(f.args[id]...)
	}
	st, err := manager.Open(context.Background(), e.db, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ns, err := st.FleetNodes(context.Background())
		if err == nil && len(ns) == len(nodeIDs) {
			for _, n := range ns {
				if n.Channel == "" {
					t.Fatalf("node %s registered no channel", n.NodeID)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nodes not registered in 20s: %v, %v\n%s", ns, err, f.logs())
		}
	}
	return f
}

func (f *fleetEnv) logs() string {
	var b strings.Builder
	for id, p := range f.procs {
		fmt.Fprintf(&b, "--- node process %s:\n%s", id, p.stderr())
	}
	return b.String()
}

// TestServeFleetOnPostgres: two `serve --fleet` replicas and three node
// processes (each next to a fake ctld on its own socket) on one real
// PostgreSQL. The replicas drive no ctld (their --socket leads nowhere):
// every create is placed in the database and carried out by the chosen
// node's process, so each sandbox runs on the node the database names
// and on no other, no node gets more than it registered, and a create
// beyond the fleet's room is refused. Exec and files reach a sandbox
// through its node's channel (mutual TLS under the test's cluster CA).
// Destroys come back with proofs verified against each node's pinned
// key, and every reservation is returned.
func TestServeFleetOnPostgres(t *testing.T) {
	srv := pgtest.Start(t)
	ids := []string{"node-a", "node-b", "node-c"}
	f := newFleetEnv(t, srv, ids, "--max-sandboxes", "4", "--poll", "200ms")
	e := f.env
	key := strings.TrimSpace(e.ok("key", "create", "--owner", "team-a"))
	e.ok("owner", "quota", "set", "team-a", "--sandboxes", "1000", "--cpu", "1000", "--memory", "1000Gi", "--creates-per-min", "100000")
	e.socket = "/nonexistent/ctld.sock" // the replicas must not need a ctld
	mgr := channelArgs(f.ca.Issue(t, "manager", false))
	args := append([]string{"--fleet", "--template", "busybox", "--default-timeout", "0", "--lease-ttl", "1s"}, mgr...)
	a := e.startServeChild("127.0.0.1:0", append(args, "--replica-id", "replica-a")...)
	b := e.startServeChild("127.0.0.1:0", append(args, "--replica-id", "replica-b")...)
	cs := []*client.Client{{BaseURL: "http://" + a.addr, Key: key}, {BaseURL: "http://" + b.addr, Key: key}}
	defer func() {
		if t.Failed() {
			t.Logf("replica A:\n%s\nreplica B:\n%s\n%s", a.stderr(), b.stderr(), f.logs())
		}
	}()
	ctx := context.Background()

	// 12 creates from 6 clients over both replicas: the fleet's room.
	var mu sync.Mutex
	var made []client.Sandbox
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2 {
				sb, err := cs[(w+i)%2].Create(ctx, client.CreateRequest{Template: "busybox"}, client.IdempotencyKey(fmt.Sprintf("c-%d-%d", w, i)))
				if err != nil || sb.State != client.StateReady {
					t.Errorf("create %d/%d: %+v, %v", w, i, sb, err)
					return
				}
				mu.Lock()
				made = append(made, sb)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	// Where the database says each runs, and only there.
	pc, err := pgx.Connect(ctx, e.db)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close(ctx)
	perNode := map[string]int{}
	for _, sb := range made {
		var node string
		if err := pc.QueryRow(ctx, `SELECT node_id FROM sandboxes WHERE id = $1`, sb.ID).Scan(&node); err != nil {
			t.Fatal(err)
		}
		perNode[node]++
		for _, id := range ids {
			got, err := f.nodes[id].Get(ctx, sb.ID)
			if on := err == nil && got.State == "ready"; on != (id == node) {
				t.Fatalf("sandbox %s: placed on %s, but on %s ready=%v (%v)", sb.ID, node, id, on, err)
			}
		}
	}
	for _, id := range ids {
		if perNode[id] != 4 {
			t.Fatalf("sandboxes per node %v, want 4 on each (4 allowed each, 12 made)", perNode)
		}
	}
	// No room left: refused with the reason, nothing placed.
	var ce *client.Error
	if _, err := cs[0].Create(ctx, client.CreateRequest{Template: "busybox"}); !errors.As(err, &ce) || !strings.Contains(ce.Message, "no node can take the claim") {
		t.Fatalf("a 13th create: %v, want refused: no node can take the claim", err)
	}

	// Streams through the node channel, from either replica.
	for i, sb := range made[:3] {
		c := cs[i%2]
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Args: []string{"echo", "hello", sb.ID}})
		if err != nil || res.ExitCode != 0 || string(res.Stdout) != "hello "+sb.ID+"\n" {
			t.Fatalf("exec in %s: %+v, %v", sb.ID, res, err)
		}
		data := []byte("placed on a node " + sb.ID)
		if err := c.WriteFile(ctx, sb.ID, "/tmp/x", bytes.NewReader(data), int64(len(data))); err != nil {
			t.Fatalf("write file in %s: %v", sb.ID, err)
		}
		var back bytes.Buffer
		if _, err := cs[(i+1)%2].ReadFile(ctx, sb.ID, "/tmp/x", &back); err != nil || back.String() != string(data) {
			t.Fatalf("read file in %s: %q, %v", sb.ID, back.String(), err)
		}
	}

	// Destroys: proofs verified against the pinned keys, capacity back.
	for i, sb := range made {
		d, err := cs[i%2].Destroy(ctx, sb.ID, client.IdempotencyKey("d-"+sb.ID))
		if err != nil || !d.Proof.Verified || !d.Proof.Clean || d.Sandbox.State != client.StateDestroyed {
			t.Fatalf("destroy %s: %+v, %v", sb.ID, d, err)
		}
	}
	var reserved, active, pending int
	if err := pc.QueryRow(ctx, `SELECT (SELECT COALESCE(sum(reserved_sandboxes + reserved_cpu_millis), 0) FROM nodes),
		(SELECT count(*) FROM reservations WHERE released_at IS NULL), (SELECT count(*) FROM operations WHERE state = 'pending')`).Scan(&reserved, &active, &pending); err != nil {
		t.Fatal(err)
	}
	if reserved != 0 || active != 0 || pending != 0 {
		t.Fatalf("after the destroys: %d reserved, %d active reservations, %d pending operations; want 0", reserved, active, pending)
	}
	for _, id := range ids {
		n := f.nodes[id]
		n.Lock()
		claims, releases := distinct(n.ClaimOps), distinct(n.ReleaseOps)
		n.Unlock()
		if claims != 4 || releases != 4 {
			t.Fatalf("node %s: %d claims, %d releases; want 4 each", id, claims, releases)
		}
	}

	// Replica A is SIGKILLed while a create it placed is held on its node
	// (done there, the node process's answer held) and a destroy it asked
	// for is held too: the node processes finish both, B answers the
	// callers' retries with their keys, each happened once.
	x, err := cs[0].Create(ctx, client.CreateRequest{Template: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	created, released := newGate("claim", true), newGate("release", false)
	for _, id := range ids {
		n := f.nodes[id]
		n.Lock()
		n.Hold = func(kind, id string, after bool) error {
			if err := created.hold(kind, id, after); err != nil {
				return err
			}
			return released.hold(kind, id, after)
		}
		n.Unlock()
	}
	go cs[0].Create(ctx, client.CreateRequest{Template: "busybox"}, client.IdempotencyKey("held-create"))
	heldID := <-created.arrived
	go cs[0].Destroy(ctx, x.ID, client.IdempotencyKey("held-destroy"))
	if got := <-released.arrived; got != x.ID {
		t.Fatalf("held release of %s, want %s", got, x.ID)
	}
	a.kill()
	created.release <- nil
	released.release <- nil
	seen := &sync.Map{}
	sb, err := retried(ctx, t, cs[1:], 0, seen, func(c *client.Client) (client.Sandbox, error) {
		return c.Create(ctx, client.CreateRequest{Template: "busybox"}, client.IdempotencyKey("held-create"))
	})
	if err != nil || sb.ID != heldID || sb.State != client.StateReady {
		t.Fatalf("retried held create through B: %+v, %v; want %s ready", sb, err, heldID)
	}
	d, err := retried(ctx, t, cs[1:], 0, seen, func(c *client.Client) (client.DestroyResult, error) {
		return c.Destroy(ctx, x.ID, client.IdempotencyKey("held-destroy"))
	})
	if err != nil || !d.Proof.Verified || d.Sandbox.State != client.StateDestroyed {
		t.Fatalf("retried held destroy through B: %+v, %v", d, err)
	}
	var claimOps, releaseOps, owned int
	if err := pc.QueryRow(ctx, `SELECT (SELECT count(*) FROM operations WHERE kind = 'claim' AND sandbox_id IN ($1, $2)),
		(SELECT count(*) FROM operations WHERE kind = 'release' AND sandbox_id IN ($1, $2)), (SELECT count(*) FROM owned_sandboxes WHERE id IN ($1, $2))`,
		x.ID, heldID).Scan(&claimOps, &releaseOps, &owned); err != nil {
		t.Fatal(err)
	}
	if claimOps != 2 || releaseOps != 1 || owned != 2 {
		t.Fatalf("after the kill: %d claim operations, %d releases, %d sandboxes; want 2, 1, 2", claimOps, releaseOps, owned)
	}
	t.Logf("replica A killed mid-create and mid-destroy: B answered both retries (retryable answers seen: %v)", keys(seen))
}
