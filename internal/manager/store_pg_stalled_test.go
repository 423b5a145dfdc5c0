package manager

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/pgtest"
)

// TestPgStalledClientDoesNotBlockTheFleet: a node process stopped
// (SIGSTOP, a frozen VM) in the middle of its heartbeat's transaction
// holds its node's row lock; another node's sweep that marks it lost
// waits on that lock. The server ends a session idle in a transaction
// (pgIdleInTxTimeout), so the sweep goes on: the stopped node is marked
// lost. (Without it the sweep waited for ever: the fleet's lost-node
// scenario hung in the VM when the stop landed mid-heartbeat.)
func TestPgStalledClientDoesNotBlockTheFleet(t *testing.T) {
	ctx := context.Background()
	stores := twoPgStores(t)
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	reg := Registration{NodeID: "stopped", Name: "stopped.example", PublicKey: pub, Allocatable: NodeAlloc{CPUMillis: 1000, MemoryBytes: 1 << 30, Sandboxes: 10},
		RunscVersion: "release-20221219.0", Platform: "ptrace", RootModes: []string{"overlay"}, TTL: time.Second}
	if _, err := stores[0].RegisterNode(ctx, reg); err != nil {
		t.Fatal(err)
	}
	// The stopped process: its heartbeat's UPDATE done, no COMMIT.
	tx, err := stores[0].db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `UPDATE nodes SET last_seen = last_seen WHERE node_id = 'stopped'`); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // past its TTL
	sctx, cancel := context.WithTimeout(ctx, pgIdleInTxTimeout+20*time.Second)
	defer cancel()
	t0 := time.Now()
	lost, err := stores[1].MarkLostNodes(sctx, 0)
	if err != nil || len(lost) != 1 || lost[0].NodeID != "stopped" {
		t.Fatalf("the sweep beside a stopped client's transaction: %+v, %v (after %v); want the node marked lost", lost, err, time.Since(t0).Round(time.Millisecond))
	}
	t.Logf("marked lost %v after the sweep began (the stopped session ended by the server)", time.Since(t0).Round(time.Millisecond))
}

// twoPgStores starts PostgreSQL and opens two stores (two replicas) on one
// new database of it.
func twoPgStores(t *testing.T) [2]*Store {
	t.Helper()
	srv := pgtest.Start(t)
	dsn := srv.NewDatabase(t)
	var stores [2]*Store
	for i := range stores {
		s, err := OpenPostgres(context.Background(), dsn, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		stores[i] = s
	}
	return stores
}
