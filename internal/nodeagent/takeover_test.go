package nodeagent_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/logging"
	"github.com/ctld/ctld/internal/manager"
	"github.com/ctld/ctld/internal/manager/fakenode"
	"github.com/ctld/ctld/internal/nodeagent"
	"github.com/ctld/ctld/internal/pgtest"
	"github.com/ctld/ctld/internal/testutil"
)

// TestLostNodesBlockSandboxResumesElsewhere: node-a's process stops
// (standing for a node frozen past its grace; its fake ctld keeps its
// sandboxes). node-b's sweep marks node-a lost: node-a's overlay sandbox
// fails and its block sandbox (paused and resumed through a fleet manager
// before, so its head is recorded) is claimed on node-b at the next
// generation from that head. node-a's late head is refused. When node-a's
// process comes back, it releases on its ctld both generations the
// database no longer gives it; their proofs verify against node-a's
// pinned key and return all of node-a's capacity, while the block
// sandbox runs on node-b.
func TestLostNodesBlockSandboxResumesElsewhere(t *testing.T) {
	ctx := context.Background()
	srv := pgtest.Start(t)
	dsn := srv.NewDatabase(t)
	replica := open(t, dsn)
	fa, fb := fakenode.New("node-a"), fakenode.New("node-b")
	var claimsOnB []api.ClaimRequest
	fb.FailClaim = func(req api.ClaimRequest) error { claimsOnB = append(claimsOnB, req); return nil }
	sa, sb := fakenode.Serve(t, fa), fakenode.Serve(t, fb)
	var logs testutil.Buffer
	defer func() {
		if t.Failed() {
			t.Logf("agents' log:\n%s", logs.String())
		}
	}()
	agent := func(socket string) *nodeagent.Agent {
		return &nodeagent.Agent{Store: open(t, dsn), Client: &api.Client{SocketPath: socket}, Log: logging.New(&logs, slog.LevelDebug),
			Templates: []string{"busybox"}, MaxSandboxes: 4, TTL: time.Second, Grace: time.Second, Poll: 50 * time.Millisecond}
	}
	a := start(t, agent(sa))
	eventually(t, "node-a registered", func() (bool, string) {
		n, err := replica.FleetNode(ctx, "node-a")
		return err == nil, fmt.Sprint(n, err)
	})
	res := api.Resources{CPUMillis: 100, MemoryBytes: 64 << 20, PIDs: 32}
	for _, p := range []struct {
		id   string
		mode api.RootFSMode
	}{{"blk", api.RootFSBlock}, {"ovl", api.RootFSOverlay}} {
		if _, err := replica.Place(ctx, manager.PlaceIntent{SandboxID: p.id, OperationID: "c-" + p.id,
			Spec: manager.Spec{Resources: res, RootFS: api.RootFS{Mode: p.mode, Template: "busybox"}}}); err != nil {
			t.Fatal(err)
		}
		eventually(t, p.id+" ready on node-a", func() (bool, string) {
			rec, err := replica.Sandbox(ctx, p.id)
			return err == nil && rec.State == api.StateReady && rec.NodeID == "node-a", fmt.Sprint(rec, err)
		})
	}
	// blk is paused and resumed through a fleet manager: its node process
	// seals the head and records it; the resume is placed from it.
	mgr := &manager.Manager{Store: replica, Fleet: &manager.Fleet{}}
	pr, err := mgr.Pause(ctx, "blk")
	if err != nil || !pr.Verdict.OK() || pr.Head.Seq != 1 || pr.Head.WriterEpoch != 1 {
		t.Fatalf("fleet pause: %+v, %v", pr, err)
	}
	if cr, err := mgr.Resume(ctx, "blk"); err != nil || cr.Sandbox.Generation != 2 || cr.Sandbox.State != api.StateReady {
		t.Fatalf("fleet resume: %+v, %v", cr, err)
	}
	if rec, _ := replica.Sandbox(ctx, "blk"); rec.NodeID != "node-a" {
		t.Fatalf("blk resumed on %s (node-b has no process yet)", rec.NodeID)
	}
	a.stop(t)
	start(t, agent(sb))
	eventually(t, "blk resumed on node-b", func() (bool, string) {
		rec, err := replica.Sandbox(ctx, "blk")
		return err == nil && rec.State == api.StateReady && rec.NodeID == "node-b" && rec.Generation == 3, fmt.Sprint(rec, err)
	})
	fb.Lock()
	got := claimsOnB
	fb.Unlock()
	if len(got) != 1 || got[0].Generation != 3 || got[0].RootFS.ExpectHead.Seq != 1 || got[0].RootFS.ExpectHead.Generation != 1 {
		t.Fatalf("claims on node-b: %+v, want blk's generation 3 from head 1", got)
	}
	if on, err := fb.Get(ctx, "blk"); err != nil || on.State != api.StateReady || on.Generation != 3 {
		t.Fatalf("blk on node-b: %+v, %v", on, err)
	}
	if rec, _ := replica.Sandbox(ctx, "ovl"); rec.State != api.StateFailed {
		t.Fatalf("ovl on the lost node: %+v, want failed", rec)
	}
	if reason, _ := replica.SandboxReason(ctx, "blk"); !strings.Contains(reason, "node node-a lost") || !strings.Contains(reason, "resumed from head 1") {
		t.Fatalf("blk's reason: %q", reason)
	}
	if err := replica.PublishPlacedHead(ctx, "node-a", "blk", 2, api.VolumeHead{Seq: 2, Generation: 2, Node: "node-a"}); err == nil {
		t.Fatal("the lost node's late head was recorded")
	}

	// node-a's process is back (its ctld never stopped): what the
	// database no longer gives it is released there, with proofs.
	start(t, agent(sa))
	eventually(t, "node-a's capacity returned", func() (bool, string) {
		n, err := replica.FleetNode(ctx, "node-a")
		return err == nil && n.State == manager.NodeReady && n.Reserved == (manager.NodeAlloc{}), fmt.Sprint(n, err)
	})
	for id, gen := range map[string]uint64{"blk": 2, "ovl": 1} {
		if on, err := fa.Get(ctx, id); err != nil || on.State != api.StateReleased || on.Generation != gen {
			t.Fatalf("%s on node-a after its return: %+v, %v; want generation %d released", id, on, err, gen)
		}
	}
	recs, err := replica.Reservations(ctx, "node-a")
	if err != nil || len(recs) != 3 {
		t.Fatalf("node-a's reservations: %+v, %v", recs, err)
	}
	for _, r := range recs {
		p, err := replica.Proof(ctx, r.ReleaseOperation)
		if err != nil || !p.Verified || p.VerifyError != "" || p.Proof.NodeID != "node-a" {
			t.Fatalf("proof of %s/%d: %+v, %v", r.SandboxID, r.Generation, p, err)
		}
	}
	if rec, _ := replica.Sandbox(ctx, "blk"); rec.State != api.StateReady || rec.NodeID != "node-b" || rec.Generation != 3 {
		t.Fatalf("blk after node-a's return: %+v", rec)
	}
	if on, _ := fb.Get(ctx, "blk"); on.State != api.StateReady {
		t.Fatalf("blk on node-b after node-a's return: %+v", on)
	}
}
