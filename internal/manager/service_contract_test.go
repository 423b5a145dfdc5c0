package manager_test

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ctld/ctld/internal/errdefs"
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

func postgresBackend(srv *pgtest.Server) backend {
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
		servicestoretest.RunLeases(t, func(t *testing.T, now func() time.Time) (manager.ServiceStore, manager.ServiceStore) {
			a, another := b.open(t, now)
			return a, another()
		})
	})
	t.Run("Usage", func(t *testing.T) { usageContract(t, b) })
}

// TestStoreContractSQLite runs the store contracts on SQLite.
func TestStoreContractSQLite(t *testing.T) { runContracts(t, sqliteBackend()) }

// TestStoreContractPostgres runs them on PostgreSQL, and checks its
// versioned migrations.
func TestStoreContractPostgres(t *testing.T) {
	srv := pgtest.Start(t)
	runContracts(t, postgresBackend(srv))
	t.Run("Migrations", func(t *testing.T) { postgresMigrations(t, srv) })
	t.Run("DatabaseRestart", func(t *testing.T) { postgresRestart(t, srv) })
}

// postgresRestart: while the database is down, reads and transactions
// fail as unavailable with a retry hint (the API's 503 + Retry-After) and
// record nothing; once it is back, the same store handle works again.
func postgresRestart(t *testing.T, srv *pgtest.Server) {
	ctx := context.Background()
	s := mustOpen(t, srv.NewDatabase(t), nil)
	if _, err := s.CreateOwner(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	srv.Stop(t)
	admit := func(id string) error {
		return s.AdmitCreate(ctx, manager.Admission{Owner: "t", ID: id, Spec: []byte("{}")})
	}
	for what, err := range map[string]error{
		"read":        func() error { _, err := s.Owner(ctx, "t"); return err }(),
		"transaction": admit("while-down"),
		"list":        func() error { _, err := s.Sandboxes(ctx); return err }(),
	} {
		if errdefs.CodeOf(err) != errdefs.CodeUnavailable || errdefs.RetryAfterOf(err) < time.Second {
			t.Errorf("%s while the database is down: %v (code %s, retry after %v), want unavailable with a hint", what, err, errdefs.CodeOf(err), errdefs.RetryAfterOf(err))
		}
	}
	srv.Restart(t)
	if err := admit("after"); err != nil {
		t.Fatalf("admit after the restart: %v", err)
	}
	if u, err := s.Usage(ctx, "t"); err != nil || u.Sandboxes != 1 {
		t.Fatalf("usage after the restart: %+v, %v; want the one admitted after it", u, err)
	}
}

// postgresMigrations: managers that start together on an empty database
// migrate it once (the advisory lock), to the version SQLite reaches; a
// database newer than the binary is refused, not used.
func postgresMigrations(t *testing.T, srv *pgtest.Server) {
	ctx := context.Background()
	lite := mustOpen(t, filepath.Join(t.TempDir(), "m.db"), nil)
	want, err := lite.SchemaVersion(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dsn := srv.NewDatabase(t)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := manager.Open(ctx, dsn, nil)
			if err == nil {
				s.Close()
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent open: %v", err)
		}
	}
	s := mustOpen(t, dsn, nil)
	if v, err := s.SchemaVersion(ctx); err != nil || v != want {
		t.Fatalf("PostgreSQL schema version %d, %v; SQLite's is %d", v, err, want)
	}
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var rows int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM schema_migrations`).Scan(&rows); err != nil || rows != want {
		t.Fatalf("schema_migrations has %d rows, %v; want one per migration (%d)", rows, err, want)
	}
	if _, err := c.Exec(ctx, `INSERT INTO schema_migrations (version, applied_at) VALUES ($1, 'a newer binary')`, want+1); err != nil {
		t.Fatal(err)
	}
	if _, err := manager.Open(ctx, dsn, nil); err == nil || !strings.Contains(err.Error(), "this binary knows") {
		t.Fatalf("open of a newer database: %v, want refused", err)
	}
}
