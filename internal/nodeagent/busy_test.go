package nodeagent_test

import (
	"context"
	"fmt"
	"log/slog"
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

// TestBusyNodeHeartbeatsAndClaimsConcurrently: claims that take longer
// than the node's TTL plus grace (as runsc starts do under load) do not
// make a node look lost: its process heartbeats while it works. And its
// claims run at once, not one after another: three claims held on the
// node are all in ctld together.
func TestBusyNodeHeartbeatsAndClaimsConcurrently(t *testing.T) {
	ctx := context.Background()
	srv := pgtest.Start(t)
	dsn := srv.NewDatabase(t)
	replica := open(t, dsn)
	fa, fb := fakenode.New("node-a"), fakenode.New("node-b")
	inside := make(chan string, 3)
	release := make(chan struct{})
	fa.Hold = func(kind, id string, after bool) error {
		if kind == "claim" && !after {
			inside <- id
			<-release
		}
		return nil
	}
	var logs testutil.Buffer
	defer func() {
		if t.Failed() {
			t.Logf("agents' log:\n%s", logs.String())
		}
	}()
	for _, f := range []*fakenode.Node{fa, fb} {
		start(t, &nodeagent.Agent{Store: open(t, dsn), Client: &api.Client{SocketPath: fakenode.Serve(t, f)}, Log: logging.New(&logs, slog.LevelDebug),
			Templates: []string{"busybox"}, MaxSandboxes: 8, TTL: 600 * time.Millisecond, Grace: 600 * time.Millisecond, Poll: 50 * time.Millisecond})
	}
	eventually(t, "both registered", func() (bool, string) {
		ns, err := replica.FleetNodes(ctx)
		return err == nil && len(ns) == 2, fmt.Sprint(ns, err)
	})
	must := func(_ manager.FleetNode, err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(replica.SetNodeState(ctx, "node-b", manager.NodeCordoned)) // all on node-a
	spec := manager.Spec{Resources: api.Resources{CPUMillis: 100, MemoryBytes: 64 << 20, PIDs: 32}, RootFS: api.RootFS{Mode: api.RootFSOverlay, Template: "busybox"}}
	for i := range 3 {
		id := fmt.Sprintf("sb%d", i)
		if _, err := replica.Place(ctx, manager.PlaceIntent{SandboxID: id, OperationID: "c-" + id, Spec: spec}); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		select {
		case <-inside:
		case <-time.After(10 * time.Second):
			t.Fatal("the node's claims did not reach ctld together")
		}
	}
	// Held well past TTL + grace while node-b's process sweeps.
	time.Sleep(3 * time.Second)
	if n, err := replica.FleetNode(ctx, "node-a"); err != nil || n.State != manager.NodeReady {
		t.Fatalf("node-a while busy: %+v, %v; want ready", n, err)
	}
	close(release)
	for i := range 3 {
		id := fmt.Sprintf("sb%d", i)
		eventually(t, id+" ready", func() (bool, string) {
			rec, err := replica.Sandbox(ctx, id)
			return err == nil && rec.State == api.StateReady, fmt.Sprint(rec, err)
		})
	}
}
