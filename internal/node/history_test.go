package node

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/journal/journaltest"
	"github.com/ctld/ctld/internal/node/op"
	bolt "go.etcd.io/bbolt"
)

// TestHotPathsNeverReadHistory: claim admission, the ledger and reconcile
// read only live generations and pending operations. History records made
// unreadable behind the journal's back prove it: a path that scans them
// fails to decode them.
func TestHotPathsNeverReadHistory(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "journal.db")
	j, err := journal.Open(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := journaltest.TakeOverNext(j); err != nil {
		t.Fatal(err)
	}
	if err := journaltest.SeedFinished(j, "hist", 50); err != nil {
		t.Fatal(err)
	}
	j.Close()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket([]byte("sandboxes")).Put([]byte("hist7"), []byte("{not json")); err != nil {
			return err
		}
		return tx.Bucket([]byte("operations")).Put([]byte("claim-hist7"), []byte("{not json"))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}

	n := growthNode(t, 0)
	n.d.Journal.Close()
	if n.d.Journal, err = journal.Open(path, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := journaltest.TakeOverNext(n.d.Journal); err != nil {
		t.Fatal(err)
	}
	defer n.d.Journal.Close()
	n.ops, n.run.J = op.NewOps(n.d.Journal, n.log), n.d.Journal // the runner's journal too
	admitOnce(t, n, 1)
	node, err := n.Node(context.Background())
	if err != nil {
		t.Fatalf("ledger: %v", err)
	}
	if node.Capacity.Leased != (Capacity{}) {
		t.Fatalf("leased %+v with no live generation", node.Capacity.Leased)
	}
	if err := n.Reconcile(context.Background()); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
}
