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

// TestLostBlockSandboxBackOnItsNode: the only node's process stops past
// its grace; the sweep marks the node lost and its block sandbox lost, and
// nothing can take it over (no other node). The process comes back (its
// ctld never stopped): the sandbox is ready again on its node at the same
// generation, and the node may publish its head. Before, it stayed lost
// for good while it ran (found by test/model).
func TestLostBlockSandboxBackOnItsNode(t *testing.T) {
	ctx := context.Background()
	srv := pgtest.Start(t)
	dsn := srv.NewDatabase(t)
	replica := open(t, dsn)
	fa := fakenode.New("node-a")
	sa := fakenode.Serve(t, fa)
	var logs testutil.Buffer
	defer func() {
		if t.Failed() {
			t.Logf("agents' log:\n%s", logs.String())
		}
	}()
	agent := func() *nodeagent.Agent {
		return &nodeagent.Agent{Store: open(t, dsn), Client: &api.Client{SocketPath: sa}, Log: logging.New(&logs, slog.LevelDebug),
			Templates: []string{"busybox"}, MaxSandboxes: 4, TTL: time.Second, Grace: time.Second, Poll: 50 * time.Millisecond}
	}
	a := start(t, agent())
	res := api.Resources{CPUMillis: 100, MemoryBytes: 64 << 20, PIDs: 32}
	eventually(t, "node-a registered", func() (bool, string) {
		n, err := replica.FleetNode(ctx, "node-a")
		return err == nil, fmt.Sprint(n, err)
	})
	if _, err := replica.Place(ctx, manager.PlaceIntent{SandboxID: "blk", OperationID: "c-blk",
		Spec: manager.Spec{Resources: res, RootFS: api.RootFS{Mode: api.RootFSBlock, Template: "busybox"}}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "blk ready on node-a", func() (bool, string) {
		rec, err := replica.Sandbox(ctx, "blk")
		return err == nil && rec.State == api.StateReady && rec.NodeID == "node-a", fmt.Sprint(rec, err)
	})
	a.stop(t)
	eventually(t, "node-a marked lost", func() (bool, string) {
		lost, err := replica.MarkLostNodes(ctx, time.Second)
		return err == nil && len(lost) == 1 && len(lost[0].Lost) == 1, fmt.Sprint(lost, err)
	})
	if moved, errs := replica.TakeOverLost(ctx, func() (string, error) { return "to-1", nil }); len(moved) != 0 {
		t.Fatalf("taken over with no other node: %+v, %v", moved, errs)
	}
	if rec, _ := replica.Sandbox(ctx, "blk"); rec.State != api.StateLost {
		t.Fatalf("blk after the loss: %+v, want lost", rec)
	}

	start(t, agent())
	eventually(t, "blk ready again on node-a", func() (bool, string) {
		rec, err := replica.Sandbox(ctx, "blk")
		return err == nil && rec.State == api.StateReady && rec.NodeID == "node-a" && rec.Generation == 1, fmt.Sprint(rec, err)
	})
	if reason, _ := replica.SandboxReason(ctx, "blk"); !strings.Contains(reason, "came back") {
		t.Fatalf("blk's reason: %q", reason)
	}
	if on, err := fa.Get(ctx, "blk"); err != nil || on.State != api.StateReady || on.Generation != 1 {
		t.Fatalf("blk on node-a: %+v, %v", on, err)
	}
	if err := replica.PublishPlacedHead(ctx, "node-a", "blk", 1, api.VolumeHead{Seq: 1, Generation: 1, Node: "node-a"}); err != nil {
		t.Fatalf("node-a's head after the readopt: %v", err)
	}
	// A generation the database no longer places there is not readopted.
	if err := replica.ReadoptLost(ctx, "node-a", "blk", 1); err == nil {
		t.Fatal("a ready sandbox was readopted")
	}
}
