package nodeagent_test

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/logging"
	"github.com/ctld/ctld/internal/manager"
	"github.com/ctld/ctld/internal/manager/fakenode"
	"github.com/ctld/ctld/internal/nodeagent"
	"github.com/ctld/ctld/internal/pgtest"
	"github.com/ctld/ctld/internal/testutil"
)

func open(t *testing.T, dsn string) *manager.Store {
	t.Helper()
	s, err := manager.Open(context.Background(), dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// eventually polls cond until it holds or 20s pass.
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached in 20s; last: %s", what, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type running struct {
	cancel context.CancelFunc
	done   chan error
}

func start(t *testing.T, a *nodeagent.Agent) *running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- a.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

func (r *running) stop(t *testing.T) {
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("agent: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("agent did not stop")
	}
}

// TestAgentsOverFakeNodesAndPostgres: two node processes, each next to a
// fake ctld on its own Unix socket, over a real PostgreSQL. Creates a
// replica places are claimed on the node the database chose; releases
// return capacity only with a clean proof signed by the node's pinned key
// (a node signing with another key keeps its capacity held); a claim ctld
// refuses returns its reservation; a node process that stops is marked
// lost by the other's sweep and its overlay sandboxes fail with the reason.
func TestAgentsOverFakeNodesAndPostgres(t *testing.T) {
	ctx := context.Background()
	srv := pgtest.Start(t)
	dsn := srv.NewDatabase(t)
	replica := open(t, dsn)
	fakes := map[string]*fakenode.Node{"node-a": fakenode.New("node-a"), "node-b": fakenode.New("node-b")}
	var logs testutil.Buffer
	agents := map[string]*running{}
	socketB := fakenode.Serve(t, fakes["node-b"])
	for _, id := range []string{"node-a", "node-b"} {
		socket := socketB
		if id == "node-a" {
			socket = fakenode.Serve(t, fakes[id])
		}
		a := &nodeagent.Agent{
			Store: open(t, dsn), Client: &api.Client{SocketPath: socket},
			Log: logging.New(&logs, slog.LevelDebug), Platform: "systrap", Templates: []string{"busybox"}, MaxSandboxes: 3,
			TTL: time.Second, Grace: time.Second, Poll: 50 * time.Millisecond,
		}
		agents[id] = start(t, a)
	}
	defer func() {
		if t.Failed() {
			t.Logf("agents' log:\n%s", logs.String())
		}
	}()
	eventually(t, "both nodes registered", func() (bool, string) {
		ns, err := replica.FleetNodes(ctx)
		return err == nil && len(ns) == 2, fmt.Sprint(ns, err)
	})
	n, _ := replica.FleetNode(ctx, "node-a")
	if n.Allocatable.Sandboxes != 3 || n.Allocatable.CPUMillis != 2000 || strings.Join(n.RootModes, ",") != "overlay,block" ||
		n.RunscVersion != "20221219" || string(n.PublicKey) != string(fakes["node-a"].Key.Public().(ed25519.PublicKey)) {
		t.Fatalf("registered node-a = %+v", n)
	}

	spec := manager.Spec{Resources: api.Resources{CPUMillis: 100, MemoryBytes: 64 << 20, PIDs: 32}, RootFS: api.RootFS{Mode: api.RootFSOverlay, Template: "busybox"}}
	where := map[string]string{}
	for i := range 6 {
		id := fmt.Sprintf("sb%d", i)
		p, err := replica.Place(ctx, manager.PlaceIntent{SandboxID: id, OperationID: "c-" + id, Spec: spec})
		if err != nil {
			t.Fatal(err)
		}
		where[id] = p.NodeID
	}
	if _, err := replica.Place(ctx, manager.PlaceIntent{SandboxID: "sb-extra", OperationID: "c-extra", Spec: spec}); errdefs.CodeOf(err) != errdefs.CodeCapacityExhausted {
		t.Fatalf("seventh create on two nodes of three: %v, want capacity_exhausted", err)
	}
	for id, nodeID := range where {
		eventually(t, id+" ready", func() (bool, string) {
			rec, err := replica.Sandbox(ctx, id)
			return err == nil && rec.State == api.StateReady, fmt.Sprint(rec, err)
		})
		// It runs where the database says, and only there.
		for fid, f := range fakes {
			sb, err := f.Get(ctx, id)
			if on := err == nil && sb.State == api.StateReady && sb.Generation == 1; on != (fid == nodeID) {
				t.Fatalf("%s placed on %s; on %s: %+v, %v", id, nodeID, fid, sb, err)
			}
		}
	}

	// Releases on node-a: clean proofs signed by its pinned key return the
	// capacity.
	var onA, onB []string
	for id, nodeID := range where {
		if nodeID == "node-a" {
			onA = append(onA, id)
		} else {
			onB = append(onB, id)
		}
	}
	release := func(id string) manager.ProofRecord {
		t.Helper()
		op, _, err := replica.BeginRelease(ctx, id, "r-"+id)
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, id+" released", func() (bool, string) {
			rec, err := replica.Sandbox(ctx, id)
			return err == nil && rec.State == api.StateReleased, fmt.Sprint(rec, err)
		})
		p, err := replica.Proof(ctx, op.OperationID)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	reserved := func(node string) int64 {
		n, err := replica.FleetNode(ctx, node)
		if err != nil {
			t.Fatal(err)
		}
		return n.Reserved.Sandboxes
	}
	for _, id := range onA[:2] {
		if p := release(id); !p.Verified || p.VerifyError != "" {
			t.Fatalf("release of %s: proof %+v", id, p)
		}
	}
	if r := reserved("node-a"); r != 1 {
		t.Fatalf("node-a holds %d reservations after two verified releases, want 1", r)
	}
	// node-b signs with a key it never registered: its release happens on
	// the node, but the capacity stays held.
	_, forged, _ := ed25519.GenerateKey(nil)
	fakes["node-b"].Lock()
	fakes["node-b"].Signer = forged
	fakes["node-b"].Unlock()
	if p := release(onB[0]); p.Verified || !strings.Contains(p.VerifyError, "pinned key") {
		t.Fatalf("forged proof accepted: %+v", p)
	}
	if r := reserved("node-b"); r != 3 {
		t.Fatalf("node-b holds %d reservations after a release with a forged proof, want 3", r)
	}
	// A claim ctld refuses for good returns its reservation (it lands on
	// node-a, the emptier).
	fakes["node-a"].Lock()
	fakes["node-a"].FailClaim = func(api.ClaimRequest) error {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "template busybox is not on this node")
	}
	fakes["node-a"].Unlock()
	p, err := replica.Place(ctx, manager.PlaceIntent{SandboxID: "refused", OperationID: "c-refused", Spec: spec})
	if err != nil || p.NodeID != "node-a" {
		t.Fatalf("place: %+v, %v", p, err)
	}
	eventually(t, "refused claim failed", func() (bool, string) {
		rec, err := replica.Sandbox(ctx, "refused")
		return err == nil && rec.State == api.StateFailed, fmt.Sprint(rec, err)
	})
	if r := reserved("node-a"); r != 1 {
		t.Fatalf("node-a holds %d reservations after a refused claim, want 1", r)
	}

	// node-b's process stops: node-a's sweep marks it lost after its TTL
	// and grace, and its ready overlay sandboxes fail with the reason.
	agents["node-b"].stop(t)
	stopped := time.Now()
	eventually(t, "node-b lost", func() (bool, string) {
		n, err := replica.FleetNode(ctx, "node-b")
		return err == nil && n.State == manager.NodeLost, fmt.Sprint(n.State, err)
	})
	t.Logf("node-b marked lost %v after its process stopped (TTL 1s, grace 1s)", time.Since(stopped).Round(10*time.Millisecond))
	for _, id := range onB[1:] {
		rec, err := replica.Sandbox(ctx, id)
		reason, _ := replica.SandboxReason(ctx, id)
		if err != nil || rec.State != api.StateFailed || !strings.Contains(reason, "node-b lost") {
			t.Fatalf("%s on the lost node: %+v (%q), %v", id, rec, reason, err)
		}
	}
	if n, _ := replica.FleetNode(ctx, "node-a"); n.State != manager.NodeReady {
		t.Fatalf("node-a, still heartbeating: %+v", n)
	}
	// A create now goes to node-a only (node-b is lost).
	fakes["node-a"].Lock()
	fakes["node-a"].FailClaim = nil
	fakes["node-a"].Unlock()
	if p, err := replica.Place(ctx, manager.PlaceIntent{SandboxID: "after", OperationID: "c-after", Spec: spec}); err != nil || p.NodeID != "node-a" {
		t.Fatalf("place after node-b was lost: %+v, %v", p, err)
	}
	// node-b's failed sandboxes still hold their reservations (2, and the
	// one of the forged proof).
	if r := reserved("node-b"); r != 3 {
		t.Fatalf("lost node-b holds %d reservations, want 3", r)
	}

	// node-b comes back (its process restarts, signing with its own key
	// again): it registers, releases on its ctld what the database failed,
	// and the verified proofs return that capacity.
	fakes["node-b"].Lock()
	fakes["node-b"].Signer = fakes["node-b"].Key
	fakes["node-b"].Unlock()
	start(t, &nodeagent.Agent{Store: open(t, dsn), Client: &api.Client{SocketPath: socketB}, Log: logging.New(&logs, slog.LevelDebug),
		Platform: "systrap", Templates: []string{"busybox"}, MaxSandboxes: 3, TTL: time.Second, Grace: time.Second, Poll: 50 * time.Millisecond})
	for _, id := range onB[1:] {
		eventually(t, id+" released on the returning node", func() (bool, string) {
			rec, err := replica.Sandbox(ctx, id)
			return err == nil && rec.State == api.StateReleased, fmt.Sprint(rec, err)
		})
		if sb, err := fakes["node-b"].Get(ctx, id); err != nil || sb.State != api.StateReleased {
			t.Fatalf("%s on node-b's ctld: %+v, %v", id, sb, err)
		}
	}
	if n, _ := replica.FleetNode(ctx, "node-b"); n.State != manager.NodeReady || n.Reserved.Sandboxes != 1 {
		t.Fatalf("node-b after it came back: %+v; want ready, holding only the forged proof's reservation", n)
	}
}

// TestAgentLeavesUnsettledWorkPending: while ctld cannot be reached the
// claim stays pending, and is sent again with the same operation id once
// it can; the node ends up with one generation.
func TestAgentLeavesUnsettledWorkPending(t *testing.T) {
	ctx := context.Background()
	srv := pgtest.Start(t)
	dsn := srv.NewDatabase(t)
	st := open(t, dsn)
	f := fakenode.New("node-a")
	a := &nodeagent.Agent{Store: st, Client: &api.Client{SocketPath: fakenode.Serve(t, f)}, TTL: time.Minute, Templates: []string{"busybox"}}
	if _, err := a.Register(ctx); err != nil {
		t.Fatal(err)
	}
	spec := manager.Spec{Resources: api.Resources{CPUMillis: 100, MemoryBytes: 64 << 20, PIDs: 32}, RootFS: api.RootFS{Mode: api.RootFSOverlay, Template: "busybox"}}
	if _, err := st.Place(ctx, manager.PlaceIntent{SandboxID: "sb", OperationID: "c-sb", Spec: spec}); err != nil {
		t.Fatal(err)
	}
	f.Lock()
	f.LoseClaimAnswer = func(api.ClaimRequest) error { return errdefs.Busy(time.Second, "answer lost") }
	f.Unlock()
	if n, err := a.Step(ctx, "node-a"); n != 0 || err == nil {
		t.Fatalf("step with the answer lost: %d settled, %v", n, err)
	}
	if op, _ := st.Operation(ctx, "c-sb"); op.State != manager.OpPending {
		t.Fatalf("operation after a lost answer: %+v", op)
	}
	f.Lock()
	f.LoseClaimAnswer = nil
	f.Unlock()
	if n, err := a.Step(ctx, "node-a"); n != 1 || err != nil {
		t.Fatalf("step: %d settled, %v", n, err)
	}
	if rec, _ := st.Sandbox(ctx, "sb"); rec.State != api.StateReady {
		t.Fatalf("sandbox: %+v", rec)
	}
	f.Lock()
	ops := append([]string(nil), f.ClaimOps...)
	f.Unlock()
	if len(ops) != 2 || ops[0] != "c-sb" || ops[1] != "c-sb" {
		t.Fatalf("claims sent: %v, want c-sb twice", ops)
	}
}

// TestAgentWokenByNotify: on PostgreSQL the node process LISTENs, so a
// claim placed on it and a release requested of it are carried out at
// once, long before its next poll (30s here).
func TestAgentWokenByNotify(t *testing.T) {
	ctx := context.Background()
	srv := pgtest.Start(t)
	dsn := srv.NewDatabase(t)
	replica := open(t, dsn)
	f := fakenode.New("node-a")
	var logs testutil.Buffer
	start(t, &nodeagent.Agent{Store: open(t, dsn), Client: &api.Client{SocketPath: fakenode.Serve(t, f)}, Log: logging.New(&logs, slog.LevelDebug),
		Templates: []string{"busybox"}, TTL: time.Minute, Poll: 30 * time.Second, ListenDSN: dsn})
	eventually(t, "registered", func() (bool, string) {
		_, err := replica.FleetNode(ctx, "node-a")
		return err == nil, fmt.Sprint(err)
	})
	time.Sleep(time.Second) // past the first polls: what follows is woken or waits 30s
	within := func(what string, d time.Duration, cond func() bool) {
		t.Helper()
		began := time.Now()
		for !cond() {
			if time.Since(began) > d {
				t.Fatalf("%s: not within %v (the poll is 30s: no wake-up)\n%s", what, d, logs.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Logf("%s after %v", what, time.Since(began).Round(time.Millisecond))
	}
	spec := manager.Spec{Resources: api.Resources{CPUMillis: 100, MemoryBytes: 64 << 20, PIDs: 32}, RootFS: api.RootFS{Mode: api.RootFSOverlay, Template: "busybox"}}
	if _, err := replica.Place(ctx, manager.PlaceIntent{SandboxID: "sb", OperationID: "c-sb", Spec: spec}); err != nil {
		t.Fatal(err)
	}
	state := func() api.SandboxState { rec, _ := replica.Sandbox(ctx, "sb"); return rec.State }
	within("claimed", 5*time.Second, func() bool { return state() == api.StateReady })
	if _, _, err := replica.RequestRelease(ctx, "sb", "r-sb"); err != nil {
		t.Fatal(err)
	}
	within("released", 5*time.Second, func() bool { return state() == api.StateReleased })
}
