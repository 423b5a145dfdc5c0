package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/manager"
	"github.com/ctld/ctld/internal/pgtest"
	"github.com/ctld/ctld/internal/testutil"
)

// TestKernelNodeProcessAgainstRealCtld: `ctl-manager node run` next to a
// real ctld registers it in a real PostgreSQL with the key and capacity
// ctld reports, carries out a claim placed on it (a real gVisor guest) and
// its release, whose cleanup proof verifies against the pinned key, so the
// reservation comes back and ctld leases nothing after.
func TestKernelNodeProcessAgainstRealCtld(t *testing.T) {
	ktest.RequireCgroup2(t, "cpu", "memory", "pids")
	ktest.RequireBinary(t, "runsc")
	ctx := context.Background()
	socket := startCtld(t)
	srv := pgtest.Start(t)
	e := &env{t: t, socket: socket, db: srv.NewDatabase(t)}
	ctld := &api.Client{SocketPath: socket}
	node, err := ctld.Node(ctx)
	if err != nil {
		t.Fatal(err)
	}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var logs testutil.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(runCtx, []string{"--socket", socket, "--db", e.db, "node", "run", "--template", "busybox", "--ttl", "10s", "--poll", "200ms"},
			strings.NewReader(""), &logs, &logs, func(string) string { return "" })
	}()
	defer func() {
		if t.Failed() {
			t.Logf("node process log:\n%s", logs.String())
		}
	}()
	var nodes []manager.FleetNode
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		r := e.run("", "--json", "node", "ls")
		if r.code == 0 && json.Unmarshal([]byte(r.stdout), &nodes) == nil && len(nodes) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node not registered: %+v", r)
		}
	}
	n := nodes[0]
	if n.NodeID != node.NodeID || string(n.PublicKey) != string(node.NodeKey) || n.State != manager.NodeReady ||
		n.Allocatable.CPUMillis != node.Capacity.Allocatable.CPUMillis || n.Allocatable.MemoryBytes != node.Capacity.Allocatable.MemoryBytes ||
		n.Allocatable.Sandboxes <= 0 || n.RunscVersion != node.Versions.Runsc {
		t.Fatalf("registered %+v; ctld says %+v", n, node)
	}

	st, err := manager.Open(ctx, e.db, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	released := false
	t.Cleanup(func() {
		if !released {
			ctld.Release(context.Background(), "fk1", api.ReleaseRequest{OperationID: "cleanup-fk1"})
		}
	})
	spec := manager.Spec{Resources: api.Resources{CPUMillis: 500, MemoryBytes: 256 << 20, PIDs: 128},
		RootFS: api.RootFS{Mode: api.RootFSOverlay, Template: "busybox"}}
	p, err := st.Place(ctx, manager.PlaceIntent{SandboxID: "fk1", OperationID: "c-fk1", Spec: spec})
	if err != nil || p.NodeID != node.NodeID {
		t.Fatalf("place: %+v, %v", p, err)
	}
	placed := time.Now()
	wait := func(what string, want api.SandboxState) {
		t.Helper()
		for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
			rec, err := st.Sandbox(ctx, "fk1")
			if err == nil && rec.State == want {
				return
			}
			if err == nil && rec.State == api.StateFailed || time.Now().After(deadline) {
				reason, _ := st.SandboxReason(ctx, "fk1")
				t.Fatalf("%s: %+v (%s), %v", what, rec, reason, err)
			}
		}
	}
	wait("claim", api.StateReady)
	t.Logf("placed to ready through the node process: %v", time.Since(placed).Round(time.Millisecond))
	if sb, err := ctld.Get(ctx, "fk1"); err != nil || sb.State != api.StateReady || sb.Generation != 1 {
		t.Fatalf("ctld has %+v, %v", sb, err)
	}
	if out, err := ctld.Exec(ctx, "fk1", api.ExecRequest{Args: []string{"/bin/hostname"}}); err != nil || strings.TrimSpace(string(out.Stdout)) != "fk1" {
		t.Fatalf("exec in the placed sandbox: %+v, %v", out, err)
	}

	if _, _, err := st.RequestRelease(ctx, "fk1", "r-fk1"); err != nil {
		t.Fatal(err)
	}
	wait("release", api.StateReleased)
	released = true
	pr, err := st.Proof(ctx, "r-fk1")
	if err != nil || !pr.Verified || pr.VerifyError != "" || len(pr.Proof.Checks) == 0 {
		t.Fatalf("proof of the release: %+v, %v", pr, err)
	}
	if n, _ := st.FleetNode(ctx, node.NodeID); n.Reserved != (manager.NodeAlloc{}) {
		t.Fatalf("reservation held after a verified clean release: %+v", n.Reserved)
	}
	if node, err := ctld.Node(ctx); err != nil || node.Capacity.Leased.CPUMillis != 0 {
		t.Fatalf("ctld still leases %+v, %v", node.Capacity.Leased, err)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("node run exited %d", code)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("node run did not stop")
	}
}
