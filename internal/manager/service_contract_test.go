package manager_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/manager"
	"github.com/ctld/ctld/internal/manager/servicestoretest"
)

// TestServiceStoreContract runs the ServiceStore contract on SQLite.
func TestServiceStoreContract(t *testing.T) {
	servicestoretest.Run(t, func(t *testing.T, now func() time.Time) manager.ServiceStore {
		s, err := manager.OpenStore(context.Background(), filepath.Join(t.TempDir(), "manager.db"), now)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}
