package service

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/manager"
)

// leaseCountStore counts the create lease writes made beside the
// admissions.
type leaseCountStore struct {
	manager.ServiceStore
	mu                  sync.Mutex
	takes, releases     int
	admitted, withLease int
}

func (c *leaseCountStore) TakeLease(ctx context.Context, l manager.OpLease, ttl time.Duration) (manager.OpLease, bool, error) {
	if strings.HasPrefix(l.ID, leaseCreate+"/") {
		c.mu.Lock()
		c.takes++
		c.mu.Unlock()
	}
	return c.ServiceStore.TakeLease(ctx, l, ttl)
}

func (c *leaseCountStore) ReleaseLease(ctx context.Context, id, holder string) error {
	if strings.HasPrefix(id, leaseCreate+"/") {
		c.mu.Lock()
		c.releases++
		c.mu.Unlock()
	}
	return c.ServiceStore.ReleaseLease(ctx, id, holder)
}

func (c *leaseCountStore) AdmitCreate(ctx context.Context, in manager.Admission) error {
	c.mu.Lock()
	c.admitted++
	if in.Lease != nil && in.Lease.Kind == leaseCreate {
		c.withLease++
	}
	c.mu.Unlock()
	return c.ServiceStore.AdmitCreate(ctx, in)
}

// TestCreateTakesItsLeaseInItsAdmission: a create's lease is taken in
// its admission's transaction (one write, not three: a lease, the
// admission, the lease's release for a refused one), and a create the
// quota refuses writes no lease at all.
func TestCreateTakesItsLeaseInItsAdmission(t *testing.T) {
	var c *leaseCountStore
	e := newEnv(t, func(s *Server) {
		c = &leaseCountStore{ServiceStore: s.Store}
		s.Store = c
	})
	ctx := context.Background()
	if _, err := e.store.SetQuota(ctx, "team-a", quotaOf(1)); err != nil {
		t.Fatal(err)
	}
	sb, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox"}, client.IdempotencyKey(fmt.Sprintf("k-%d", i))); errCode(err) != client.CodeQuotaExceeded {
			t.Fatalf("create over quota: %v", err)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.admitted != 6 || c.withLease != 6 || c.takes != 0 {
		t.Fatalf("%d admissions, %d with their lease, %d leases taken apart; want 6, 6, 0", c.admitted, c.withLease, c.takes)
	}
	// The created one's lease is released once settled; the refused ones had none.
	if c.releases != 1 {
		t.Fatalf("%d lease releases, want 1 (the created sandbox %s's)", c.releases, sb.ID)
	}
}
