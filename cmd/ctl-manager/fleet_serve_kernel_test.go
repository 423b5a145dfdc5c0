package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/manager"
	"github.com/ctld/ctld/internal/nodechannel/channeltest"
	"github.com/ctld/ctld/internal/pgtest"
)

// TestKernelServeFleetAgainstRealCtld: a `serve --fleet` replica (whose
// own --socket leads nowhere) and a `node run` process next to a real
// ctld, on a real PostgreSQL. A create through the replica is placed,
// claimed by the node process on ctld (a real gVisor guest) and answered
// ready; exec and files reach the guest through the node channel (mTLS);
// the destroy's proof verifies against the node's pinned key and ctld
// leases nothing after. Then create→ready through the replica and the
// node process is timed against the same claim sent to ctld directly,
// interleaved, CTLD_FLEET_BENCH_ROUNDS each (default 0 in make test: six
// more guest starts under TCG; the ratio is logged, and the guest's start
// dominates both).
func TestKernelServeFleetAgainstRealCtld(t *testing.T) {
	ktest.RequireCgroup2(t, "cpu", "memory", "pids")
	ktest.RequireBinary(t, "runsc")
	ctx := context.Background()
	socket := startCtld(t)
	srv := pgtest.Start(t)
	e := &env{t: t, socket: socket, db: srv.NewDatabase(t)}
	ca := channeltest.NewCA(t, "cluster")
	ctld := &api.Client{SocketPath: socket}
	node, err := ctld.Node(ctx)
	if err != nil {
		t.Fatal(err)
	}
	np := e.startChild(append([]string{"--socket", socket, "--db", e.db, "node", "run", "--template", "busybox", "--ttl", "10s", "--poll", "200ms", "--usage-pull", "200ms",
		"--channel-listen", "127.0.0.1:0"}, channelArgs(ca.Issue(t, node.NodeID, true))...)...)
	r, c := e.startFleetReplica(ca, e.fleetOwner(), "--template", "busybox", "--create-timeout", "3m")
	defer func() {
		if t.Failed() {
			t.Logf("replica:\n%s\nnode process:\n%s", r.stderr(), np.stderr())
		}
	}()
	st := e.fleetStore(ctx, 1)

	sb, err := c.Create(ctx, client.CreateRequest{Template: "busybox"})
	if err != nil || sb.State != client.StateReady {
		t.Fatalf("create: %+v, %v", sb, err)
	}
	released := map[string]bool{}
	t.Cleanup(func() {
		for id, ok := range released {
			if !ok {
				ctld.Release(context.Background(), id, api.ReleaseRequest{OperationID: "cleanup-" + id})
			}
		}
	})
	released[sb.ID] = false
	if on, err := ctld.Get(ctx, sb.ID); err != nil || on.State != api.StateReady {
		t.Fatalf("ctld has %+v, %v", on, err)
	}
	res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Args: []string{"/bin/hostname"}})
	if err != nil || res.ExitCode != 0 || strings.TrimSpace(string(res.Stdout)) != sb.ID {
		t.Fatalf("exec through the node channel: %+v, %v", res, err)
	}
	data := []byte("through the node channel\n")
	if err := c.WriteFile(ctx, sb.ID, "/tmp/f", bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatal(err)
	}
	var back bytes.Buffer
	if _, err := c.ReadFile(ctx, sb.ID, "/tmp/f", &back); err != nil || back.String() != string(data) {
		t.Fatalf("read back %q, %v", back.String(), err)
	}
	// The claim the node process sent, for the direct baseline below.
	pc, err := pgx.Connect(ctx, e.db)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close(ctx)
	var request []byte
	if err := pc.QueryRow(ctx, `SELECT request FROM operations WHERE sandbox_id = $1 AND kind = 'claim'`, sb.ID).Scan(&request); err != nil {
		t.Fatal(err)
	}
	claim, err := manager.ClaimRequestOf(manager.OperationRecord{OperationID: "x", Generation: 1, Request: request})
	if err != nil {
		t.Fatal(err)
	}
	destroy := func(id string) {
		t.Helper()
		d, err := c.Destroy(ctx, id)
		if err != nil || !d.Proof.Verified || !d.Proof.Clean || d.Sandbox.State != client.StateDestroyed {
			t.Fatalf("destroy %s: %+v, %v", id, d, err)
		}
		released[id] = true
	}
	destroy(sb.ID)

	// A guest's exit under on_exit destroy: ctld's exit watch journals it,
	// the node process records it, the replica destroys the sandbox
	// through the node with a verified proof. The node process pulled
	// ctld's final usage record of each sandbox.
	ex, err := c.Create(ctx, client.CreateRequest{Template: "busybox", OnExit: client.OnExitDestroy,
		Args: []string{"/bin/sh", "-c", "while [ ! -e /tmp/go ]; do sleep 0.05; done; exit 7"}})
	if err != nil || ex.State != client.StateReady {
		t.Fatalf("create on_exit destroy: %+v, %v", ex, err)
	}
	released[ex.ID] = false
	if res, err := c.Exec(ctx, ex.ID, client.ExecRequest{Args: []string{"/bin/touch", "/tmp/go"}}); err != nil || res.ExitCode != 0 {
		t.Fatalf("exec touch: %+v, %v", res, err)
	}
	t0 := time.Now()
	for deadline := t0.Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		got, err := c.Get(ctx, ex.ID)
		if err == nil && got.State == client.StateDestroyed && got.Reason != "" { // the reason is recorded just after the node's release
			if got.Exit == nil || got.Exit.Code != 7 || got.Reason != "exited: code 7" {
				t.Fatalf("destroyed on exit: %+v exit %+v", got, got.Exit)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s 2m after its workload was let exit: %+v, %v", ex.ID, got, err)
		}
	}
	released[ex.ID] = true
	t.Logf("guest exit 7 to destroyed through the fleet in %v", time.Since(t0).Round(10*time.Millisecond))
	var verified, finals int
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if err := pc.QueryRow(ctx, `SELECT (SELECT count(*) FROM proofs WHERE sandbox_id = $1 AND verified = 1),
			(SELECT count(*) FROM usage_records WHERE sandbox_id IN ($1, $2) AND final = 1)`, ex.ID, sb.ID).Scan(&verified, &finals); err != nil {
			t.Fatal(err)
		}
		if verified == 1 && finals == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d verified proofs of the destroy on exit, %d final usage records pulled; want 1 and 2", verified, finals)
		}
	}

	rounds, _ := strconv.Atoi(os.Getenv("CTLD_FLEET_BENCH_ROUNDS"))
	var viaFleet, direct []time.Duration
	for i := range rounds {
		start := time.Now()
		sb, err := c.Create(ctx, client.CreateRequest{Template: "busybox"})
		if err != nil || sb.State != client.StateReady {
			t.Fatalf("create %d: %+v, %v", i, sb, err)
		}
		viaFleet = append(viaFleet, time.Since(start))
		released[sb.ID] = false
		destroy(sb.ID)

		id := fmt.Sprintf("direct-%d", i)
		claim.OperationID = "c-" + id
		start = time.Now()
		if _, err := ctld.Claim(ctx, id, claim); err != nil {
			t.Fatalf("direct claim %s: %v", id, err)
		}
		direct = append(direct, time.Since(start))
		released[id] = false
		if _, err := ctld.Release(ctx, id, api.ReleaseRequest{OperationID: "r-" + id, Generation: 1}); err != nil {
			t.Fatal(err)
		}
		released[id] = true
	}
	if n, _ := st.FleetNode(ctx, node.NodeID); n.Reserved != (manager.NodeAlloc{}) {
		t.Fatalf("reservations held after verified releases: %+v", n.Reserved)
	}
	if n, err := ctld.Node(ctx); err != nil || n.Capacity.Leased.CPUMillis != 0 {
		t.Fatalf("ctld still leases %+v, %v", n.Capacity.Leased, err)
	}
	if rounds == 0 {
		return
	}
	p50 := func(d []time.Duration) time.Duration { s := slices.Clone(d); slices.Sort(s); return s[len(s)/2] }
	t.Logf("create→ready through a replica and the node process: %v (p50 %v); the same claim on ctld directly: %v (p50 %v); ratio %.2f",
		viaFleet, p50(viaFleet), direct, p50(direct), float64(p50(viaFleet))/float64(p50(direct)))
}
