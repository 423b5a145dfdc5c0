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
// fails and its block sandbox is claimed on node-b at the next generation
// from its recorded head. node-a's late head is refused. When node-a's
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
	// blk's committed head (a pause's, in the fleet to come).
	if err := replica.PublishPlacedHead(ctx, "node-a", "blk", 1, api.VolumeHead{Seq: 3, Generation: 5, Node: "node-a"}); err != nil {
		t.Fatal(err)
	}
	a.stop(t)
	start(t, agent(sb))
	eventually(t, "blk resumed on node-b", func() (bool, string) {
		rec, err := replica.Sandbox(ctx, "blk")
		return err == nil && rec.State == api.StateReady && rec.NodeID == "node-b" && rec.Generation == 2, fmt.Sprint(rec, err)
	})
	fb.Lock()
	got := claimsOnB
	fb.Unlock()
	if len(got) != 1 || got[0].Generation != 2 || got[0].RootFS.ExpectHead.Seq != 3 || got[0].RootFS.ExpectHead.Generation != 5 {
		t.Fatalf("claims on node-b: %+v, want blk's generation 2 from head 3", got)
	}
	if on, err := fb.Get(ctx, "blk"); err != nil || on.State != api.StateReady || on.Generation != 2 {
		t.Fatalf("blk on node-b: %+v, %v", on, err)
	}
	if rec, _ := replica.Sandbox(ctx, "ovl"); rec.State != api.StateFailed {
		t.Fatalf("ovl on the lost node: %+v, want failed", rec)
	}
	if reason, _ := replica.SandboxReason(ctx, "blk"); !strings.Contains(reason, "node node-a lost") || !strings.Contains(reason, "resumed from head 3") {
		t.Fatalf("blk's reason: %q", reason)
	}
	if err := replica.PublishPlacedHead(ctx, "node-a", "blk", 1, api.VolumeHead{Seq: 4, Generation: 6, Node: "node-a"}); err == nil {
		t.Fatal("the lost node's late head was recorded")
	}

	// node-a's process is back (its ctld never stopped): what the
	// database no longer gives it is released there, with proofs.
	start(t, agent(sa))
	eventually(t, "node-a's capacity returned", func() (bool, string) {
		n, err := replica.FleetNode(ctx, "node-a")
		return err == nil && n.State == manager.NodeReady && n.Reserved == (manager.NodeAlloc{}), fmt.Sprint(n, err)
	})
	for _, id := range []string{"blk", "ovl"} {
		if on, err := fa.Get(ctx, id); err != nil || on.State != api.StateReleased || on.Generation != 1 {
			t.Fatalf("%s on node-a after its return: %+v, %v; want generation 1 released", id, on, err)
		}
	}
	recs, err := replica.Reservations(ctx, "node-a")
	if err != nil || len(recs) != 2 {
		t.Fatalf("node-a's reservations: %+v, %v", recs, err)
	}
	for _, r := range recs {
		p, err := replica.Proof(ctx, r.ReleaseOperation)
		if err != nil || !p.Verified || p.VerifyError != "" || p.Proof.NodeID != "node-a" {
			t.Fatalf("proof of %s/%d: %+v, %v", r.SandboxID, r.Generation, p, err)
		}
	}
	if rec, _ := replica.Sandbox(ctx, "blk"); rec.State != api.StateReady || rec.NodeID != "node-b" || rec.Generation != 2 {
		t.Fatalf("blk after node-a's return: %+v", rec)
	}
	if on, _ := fb.Get(ctx, "blk"); on.State != api.StateReady {
		t.Fatalf("blk on node-b after node-a's return: %+v", on)
	}
}
