package manager_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/manager"
	"github.com/ctld/ctld/internal/manager/servicestoretest"
	"github.com/ctld/ctld/internal/manager/storetest"
	"github.com/ctld/ctld/internal/pgtest"
)

// The store contracts (lifecycle and service) on both backends: SQLite
// files in the test's temp dir, and a real PostgreSQL server this test
// starts (pgtest), a fresh database per case.

type backend struct {
	name string
	// open returns a handle on a fresh database, and a function that
	// opens another handle on the same one.
	open func(t *testing.T, now func() time.Time) (*manager.Store, func() *manager.Store)
}

func mustOpen(t *testing.T, db string, now func() time.Time) *manager.Store {
	t.Helper()
	s, err := manager.Open(context.Background(), db, now)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func sqliteBackend() backend {
	return backend{"SQLite", func(t *testing.T, now func() time.Time) (*manager.Store, func() *manager.Store) {
		path := filepath.Join(t.TempDir(), "manager.db")
		return mustOpen(t, path, now), func() *manager.Store { return mustOpen(t, path, now) }
	}}
}

func postgresBackend(t *testing.T) backend {
	srv := pgtest.Start(t)
	return backend{"PostgreSQL", func(t *testing.T, now func() time.Time) (*manager.Store, func() *manager.Store) {
		dsn := srv.NewDatabase(t)
		s := mustOpen(t, dsn, now)
		if s.Backend() != "postgres" {
			t.Fatalf("%s opened a %s store", manager.RedactDSN(dsn), s.Backend())
		}
		return s, func() *manager.Store { return mustOpen(t, dsn, now) }
	}}
}

func runContracts(t *testing.T, b backend) {
	t.Run("Lifecycle", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T, now func() time.Time) (*manager.Store, *manager.Store) {
			a, another := b.open(t, now)
			return a, another()
		})
	})
	t.Run("Service", func(t *testing.T) {
		servicestoretest.Run(t, func(t *testing.T, now func() time.Time) manager.ServiceStore {
			s, _ := b.open(t, now)
			return s
		})
		servicestoretest.RunShared(t, func(t *testing.T, now func() time.Time) (manager.ServiceStore, manager.ServiceStore) {
			a, another := b.open(t, now)
			return a, another()
		})
	})
}

// TestStoreContractSQLite runs the store contracts on SQLite.
func TestStoreContractSQLite(t *testing.T) { runContracts(t, sqliteBackend()) }

// TestStoreContractPostgres runs them on PostgreSQL.
func TestStoreContractPostgres(t *testing.T) { runContracts(t, postgresBackend(t)) }
