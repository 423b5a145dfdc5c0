package nodeagent

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/manager"
	"github.com/ctld/ctld/internal/manager/fakenode"
)

// TestWarmPoolCountsInPlacement: on SQLite, a node whose ctld's warm pool
// holds most of its CPU registers that warm row, and placement refuses a
// claim that fits allocatable - reserved but not beside the pool
// (ctld would answer capacity_exhausted); once ctld's pool holds less, a
// heartbeat carries it and the claim is placed there.
func TestWarmPoolCountsInPlacement(t *testing.T) {
	ctx := context.Background()
	st, err := manager.OpenStore(ctx, filepath.Join(t.TempDir(), "m.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	f := fakenode.New("node-a")
	f.Warm = api.Capacity{CPUMillis: 1900, MemoryBytes: 1 << 30, PIDs: 200, DiskBytes: 1 << 30, Addresses: 2}
	a := &Agent{Store: st, Client: &api.Client{SocketPath: fakenode.Serve(t, f)}, TTL: time.Minute, Templates: []string{"busybox"}}
	rec, err := a.Register(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := (manager.NodeAlloc{CPUMillis: 1900, MemoryBytes: 1 << 30, DiskBytes: 1 << 30, Sandboxes: 2}); rec.Warm != want {
		t.Fatalf("registered warm %+v, want %+v", rec.Warm, want)
	}
	spec := manager.Spec{Resources: api.Resources{CPUMillis: 200, MemoryBytes: 64 << 20, PIDs: 32}, RootFS: api.RootFS{Mode: api.RootFSOverlay, Template: "busybox"}}
	if _, err := st.Place(ctx, manager.PlaceIntent{SandboxID: "sb", OperationID: "c-sb", Spec: spec}); errdefs.CodeOf(err) != errdefs.CodeCapacityExhausted || !strings.Contains(err.Error(), "node-a: full") {
		t.Fatalf("place 200m beside a pool of 1900m of 2000m: %v, want capacity_exhausted (node-a: full)", err)
	}
	f.Lock()
	f.Warm = api.Capacity{CPUMillis: 100, MemoryBytes: 128 << 20, PIDs: 100, DiskBytes: 1 << 20, Addresses: 1}
	f.Unlock()
	if _, err := a.beat(ctx, "node-a"); err != nil {
		t.Fatal(err)
	}
	p, err := st.Place(ctx, manager.PlaceIntent{SandboxID: "sb", OperationID: "c-sb", Spec: spec})
	if err != nil || p.NodeID != "node-a" {
		t.Fatalf("place after the heartbeat with the pool at 100m: %+v %v", p, err)
	}
}

// TestWarmRow: the members' addresses cost placeable sandboxes only past
// the addresses the operator's bound leaves spare.
func TestWarmRow(t *testing.T) {
	n := api.Node{Capacity: api.NodeCapacity{Allocatable: api.Capacity{Addresses: 10}, Warm: api.Capacity{CPUMillis: 300, MemoryBytes: 3, DiskBytes: 4, Addresses: 3}}}
	for _, tc := range []struct {
		max, want int64
	}{{0, 3}, {8, 1}, {7, 0}, {2, 0}, {10, 3}} {
		if got := (&Agent{MaxSandboxes: tc.max}).warm(n); got != (manager.NodeAlloc{CPUMillis: 300, MemoryBytes: 3, DiskBytes: 4, Sandboxes: tc.want}) {
			t.Errorf("max sandboxes %d: warm %+v, want %d sandboxes", tc.max, got, tc.want)
		}
	}
}
