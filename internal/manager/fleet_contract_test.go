package manager_test

import (
	"testing"
	"time"

	"github.com/ctld/ctld/internal/manager"
	"github.com/ctld/ctld/internal/manager/fleettest"
	"github.com/ctld/ctld/internal/pgtest"
)

// The fleet's store contract (nodes, placement, reservations) on both
// backends: SQLite files, and a real PostgreSQL server this test starts.

func runFleetContract(t *testing.T, b backend) {
	fleettest.Run(t, func(t *testing.T, now func() time.Time) (*manager.Store, *manager.Store) {
		a, another := b.open(t, now)
		return a, another()
	})
}

// TestFleetContractSQLite runs the fleet contract on SQLite.
func TestFleetContractSQLite(t *testing.T) { runFleetContract(t, sqliteBackend()) }

// TestFleetContractPostgres runs it on PostgreSQL.
func TestFleetContractPostgres(t *testing.T) { runFleetContract(t, postgresBackend(pgtest.Start(t))) }
