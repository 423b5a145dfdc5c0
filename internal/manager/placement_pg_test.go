package manager

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/pgtest"
)

// TestPgPlacementsSpreadWhenOneCommitsBetween: a placement reads two idle
// nodes, then another replica's placement commits on the lower one (the
// tie's winner) before the first locks it. The first must see the row as
// it is now and take the other node (READ COMMITTED: the row still fit,
// and both creates landed on one node while the other stayed idle; the
// fleet's two-node VM test saw it).
func TestPgPlacementsSpreadWhenOneCommitsBetween(t *testing.T) {
	ctx := context.Background()
	stores := twoPgStores(t)
	for _, id := range []string{"a", "b"} {
		pub, _, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := stores[0].RegisterNode(ctx, Registration{NodeID: id, Name: id + ".example", PublicKey: pub,
			Allocatable:  NodeAlloc{CPUMillis: 4000, MemoryBytes: 8 << 30, DiskBytes: 8 << 30, Sandboxes: 10},
			RunscVersion: "release-20221219.0", Platform: "ptrace", RootModes: []string{"overlay"}, Templates: []string{"busybox"}, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	spec := Spec{Resources: api.Resources{CPUMillis: 500, MemoryBytes: 256 << 20, DiskBytes: 1 << 30, PIDs: 64},
		RootFS: api.RootFS{Mode: api.RootFSOverlay, Template: "busybox"}}
	read, other := make(chan struct{}), make(chan struct{})
	first := true
	stores[1].afterNodeRead = func() {
		if first {
			first = false
			close(read)
			<-other
		}
	}
	got := make(chan Placement, 1)
	errc := make(chan error, 1)
	go func() {
		p, err := stores[1].Place(ctx, PlaceIntent{SandboxID: "late", OperationID: "op-late", Spec: spec})
		got <- p
		errc <- err
	}()
	select {
	case <-read:
	case <-time.After(time.Minute):
		t.Fatal("the first placement never read the nodes")
	}
	early, err := stores[0].Place(ctx, PlaceIntent{SandboxID: "early", OperationID: "op-early", Spec: spec})
	close(other)
	if err != nil {
		t.Fatal(err)
	}
	late := <-got
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if early.NodeID == late.NodeID {
		t.Fatalf("both placements on node %s; want one per node", early.NodeID)
	}
	for _, id := range []string{"a", "b"} {
		n, err := stores[0].FleetNode(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if want := (NodeAlloc{CPUMillis: 500, MemoryBytes: 256 << 20, DiskBytes: 1 << 30, Sandboxes: 1}); n.Reserved != want {
			t.Errorf("node %s reserved %+v, want %+v", id, n.Reserved, want)
		}
	}
	t.Logf("early on %s, late on %s", early.NodeID, late.NodeID)
}

// TestPgPlacementWaitsOutAHeartbeat: a node's own heartbeat holds its row
// for its transaction. A placement must look past that and take the least
// loaded node, not pass it over at once as if another placement held it
// (both of the fleet VM test's creates went to one node while the other
// node's heartbeat was writing).
func TestPgPlacementWaitsOutAHeartbeat(t *testing.T) {
	srv := pgtest.Start(t)
	dsn := srv.NewDatabase(t)
	ctx := context.Background()
	st, err := OpenPostgres(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	for _, id := range []string{"a", "b"} {
		pub, _, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.RegisterNode(ctx, Registration{NodeID: id, Name: id + ".example", PublicKey: pub,
			Allocatable:  NodeAlloc{CPUMillis: 4000, MemoryBytes: 8 << 30, DiskBytes: 8 << 30, Sandboxes: 10},
			RunscVersion: "release-20221219.0", Platform: "ptrace", RootModes: []string{"overlay"}, Templates: []string{"busybox"}, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	spec := Spec{Resources: api.Resources{CPUMillis: 500, MemoryBytes: 256 << 20, DiskBytes: 1 << 30, PIDs: 64},
		RootFS: api.RootFS{Mode: api.RootFSOverlay, Template: "busybox"}}
	if p, err := st.Place(ctx, PlaceIntent{SandboxID: "first", OperationID: "op-first", Spec: spec}); err != nil || p.NodeID != "a" {
		t.Fatalf("first placement: %+v, %v; want node a (the tie's lower id)", p, err)
	}
	// Node b's heartbeat, mid-transaction.
	hb, err := st.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer hb.Rollback()
	if _, err := hb.ExecContext(ctx, `UPDATE nodes SET heartbeat_at = heartbeat_at WHERE node_id = 'b'`); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var p Placement
	go func() {
		defer close(done)
		p, err = st.Place(ctx, PlaceIntent{SandboxID: "second", OperationID: "op-second", Spec: spec})
	}()
	time.Sleep(100 * time.Millisecond) // a heartbeat's transaction, TCG-slow
	if err := hb.Commit(); err != nil {
		t.Fatal(err)
	}
	<-done
	if err != nil || p.NodeID != "b" {
		t.Fatalf("placement beside node b's heartbeat: node %q, %v; want node b (node a holds one already)", p.NodeID, err)
	}
}
