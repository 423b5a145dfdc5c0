package manager

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time {
	c.t = c.t.Add(time.Second)
	return c.t
}

func openTestStore(t *testing.T) *Store {
	t.Helper()
	clk := &fakeClock{t: time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)}
	s, err := OpenStore(context.Background(), filepath.Join(t.TempDir(), "sub", "manager.db"), clk.now)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestStoreMigrationsAndPragmas(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "m.db")
	s, err := OpenStore(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := s.SchemaVersion(ctx); err != nil || v != len(migrations) {
		t.Fatalf("schema version = %d, %v; want %d", v, err, len(migrations))
	}
	var mode string
	var fk, busy int
	if err := s.db.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode); err != nil {
		t.Fatal(err)
	}
	if err := s.db.QueryRowContext(ctx, `PRAGMA foreign_keys`).Scan(&fk); err != nil {
		t.Fatal(err)
	}
	if err := s.db.QueryRowContext(ctx, `PRAGMA busy_timeout`).Scan(&busy); err != nil {
		t.Fatal(err)
	}
	if mode != "wal" || fk != 1 || busy < 1000 {
		t.Fatalf("journal_mode=%s foreign_keys=%d busy_timeout=%d; want wal, 1, >=1000", mode, fk, busy)
	}
	// Foreign keys are enforced: an operation needs its generation.
	_, err = s.db.ExecContext(ctx, `INSERT INTO operations (operation_id, kind, sandbox_id, generation, state, created_at) VALUES ('o', 'claim', 'nope', 1, 'pending', 'x')`)
	if err == nil {
		t.Fatal("operation without generation was accepted: foreign keys not enforced")
	}
	s.Close()

	// Reopening an up-to-date database changes nothing.
	s, err = OpenStore(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := s.SchemaVersion(ctx); v != len(migrations) {
		t.Fatalf("schema version after reopen = %d", v)
	}
	// A database from a newer binary is refused, not silently used.
	if _, err := s.db.ExecContext(ctx, `PRAGMA user_version = 99`); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := OpenStore(ctx, path, nil); err == nil {
		t.Fatal("opened a database with a newer schema")
	}
}

func TestStoreAdoptAndConcurrentOpen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "m.db")
	a, err := OpenStore(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := OpenStore(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := a.PinNode(ctx, "n", "/s", nil); err != nil {
		t.Fatal(err)
	}
	if err := a.AdoptSandbox(ctx, "n", api.Sandbox{ID: "orphan", Generation: 7, State: api.StateReady, LeaseID: "l7"}); err != nil {
		t.Fatal(err)
	}
	// The other handle (another CLI process) sees it.
	rec, err := b.Sandbox(ctx, "orphan")
	if err != nil || rec.Generation != 7 || rec.NodeID != "n" {
		t.Fatalf("adopted = %+v, %v", rec, err)
	}
	op, _, err := b.BeginRelease(ctx, "orphan", "r")
	if err != nil || op.Generation != 7 {
		t.Fatalf("release of adopted = %+v, %v", op, err)
	}
	var n int
	if err := a.db.QueryRowContext(ctx, `SELECT count(*) FROM operations WHERE state = 'pending'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("pending ops = %d, %v", n, err)
	}
}
