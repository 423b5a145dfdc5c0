package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/manager"
	"github.com/ctld/ctld/internal/manager/fakenode"
	"github.com/ctld/ctld/internal/pgtest"
	"github.com/ctld/ctld/internal/testutil"
)

// TestCLINodeProcessOnPostgres: `node run` next to a (fake) ctld registers
// it in a real PostgreSQL and carries out a claim placed on it; `node ls`,
// `cordon` and `uncordon` show and switch it; a second process that
// presents another key for the same node id is refused; the process stops
// cleanly on its signal (context).
func TestCLINodeProcessOnPostgres(t *testing.T) {
	ctx := context.Background()
	srv := pgtest.Start(t)
	e := newEnv(t)
	e.db = srv.NewDatabase(t)

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var logs testutil.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(runCtx, []string{"--socket", e.socket, "--db", e.db, "node", "run", "--name", "a.example", "--template", "busybox",
			"--max-sandboxes", "2", "--ttl", "2s", "--poll", "50ms"}, strings.NewReader(""), &logs, &logs, func(string) string { return "" })
	}()
	var nodes []manager.FleetNode
	for deadline := time.Now().Add(20 * time.Second); ; {
		r := e.run("", "--json", "node", "ls")
		if r.code == 0 && json.Unmarshal([]byte(r.stdout), &nodes) == nil && len(nodes) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node not registered: %+v\n%s", r, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := nodes[0]; n.NodeID != "node-a" || n.Name != "a.example" || n.State != "ready" || n.Allocatable.Sandboxes != 2 || strings.Join(n.Templates, ",") != "busybox" {
		t.Fatalf("node ls --json: %+v", n)
	}

	st, err := manager.Open(ctx, e.db, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	spec := manager.Spec{Resources: api.Resources{CPUMillis: 100, MemoryBytes: 64 << 20, PIDs: 32}, RootFS: api.RootFS{Mode: api.RootFSOverlay, Template: "busybox"}}
	if p, err := st.Place(ctx, manager.PlaceIntent{SandboxID: "sb1", OperationID: "c-sb1", Spec: spec}); err != nil || p.NodeID != "node-a" {
		t.Fatalf("place: %+v, %v", p, err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; {
		if rec, _ := st.Sandbox(ctx, "sb1"); rec.State == api.StateReady {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sb1 not ready:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if sb, err := e.node.Get(ctx, "sb1"); err != nil || sb.State != api.StateReady {
		t.Fatalf("on the node: %+v, %v", sb, err)
	}

	if out := e.ok("node", "cordon", "node-a"); out != "node node-a is cordoned\n" {
		t.Fatalf("cordon: %q", out)
	}
	if _, err := st.Place(ctx, manager.PlaceIntent{SandboxID: "sb2", OperationID: "c-sb2", Spec: spec}); errdefs.CodeOf(err) != errdefs.CodeCapacityExhausted {
		t.Fatalf("place on a cordoned node: %v", err)
	}
	e.ok("node", "uncordon", "node-a")
	// Drain reports progress: the overlay sandbox cannot move, so it is left.
	if out := e.ok("node", "drain", "node-a"); !strings.Contains(out, "node node-a: 0 paused, 0 failed, 1 left\n") || !strings.Contains(out, "sb1 (overlay, ready)") {
		t.Fatalf("drain: %q", out)
	}
	if _, err := st.Place(ctx, manager.PlaceIntent{SandboxID: "sb2", OperationID: "c-sb2", Spec: spec}); errdefs.CodeOf(err) != errdefs.CodeCapacityExhausted {
		t.Fatalf("place on a draining node: %v", err)
	}
	e.ok("node", "uncordon", "node-a")
	out := e.ok("node", "ls")
	if !strings.Contains(out, "node-a  a.example  ready") || !strings.Contains(out, "1/2") || strings.Contains(out, "warm pool") {
		t.Fatalf("node ls:\n%s", out)
	}
	// ctld's warm row reaches the database with a heartbeat and shows.
	e.node.Lock()
	e.node.Warm = api.Capacity{CPUMillis: 200, MemoryBytes: 256 << 20, Addresses: 1}
	e.node.Unlock()
	for deadline := time.Now().Add(20 * time.Second); ; {
		out = e.ok("node", "ls")
		if strings.Contains(out, "node-a: warm pool holds ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node ls without the warm pool:\n%s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("node ls:\n%s", out)
	if r := e.run("", "node", "cordon", "node-zz"); r.code != exitFailed || !strings.Contains(r.stderr, "not_found") {
		t.Fatalf("cordon of an unknown node: %+v", r)
	}

	// Another ctld claiming to be node-a, with its own key, is refused.
	imp := fakenode.New("node-a")
	r := e.run("", "--socket", fakenode.Serve(t, imp), "node", "run", "--ttl", "2s")
	if r.code != exitFailed || !strings.Contains(r.stderr, "fenced") || !strings.Contains(r.stderr, "pinned") {
		t.Fatalf("node run with another key: %+v", r)
	}

	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("node run exited %d:\n%s", code, logs.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("node run did not stop")
	}
	if !strings.Contains(logs.String(), "node registered") || !strings.Contains(logs.String(), "claimed") {
		t.Fatalf("node run's log:\n%s", logs.String())
	}
}
