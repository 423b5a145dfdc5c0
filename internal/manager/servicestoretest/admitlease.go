package servicestoretest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/manager"
)

// admitWithLease: a create's lease is taken in its admission's
// transaction: admitted, the lease is the holder's; refused (quota), there
// is no lease either; a lease another holder holds live refuses the
// admission (ErrLeaseHeld, unavailable) and admits nothing; an expired
// one is taken over with the admission.
func admitWithLease(t *testing.T, open Opener) {
	ctx := context.Background()
	s, clk := newStore(t, open)
	if _, err := s.CreateOwner(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetQuota(ctx, "t", manager.Quota{Sandboxes: 1, CPUMillis: 1000, MemoryBytes: 1 << 30, DiskBytes: 1 << 30, CreatesPerMin: 100}); err != nil {
		t.Fatal(err)
	}
	admit := func(id, holder string) error {
		l := manager.OpLease{ID: "create/" + id, Kind: "create", SandboxID: id, Owner: "t", Holder: holder, IdemOwner: "t", IdemKey: "k-" + id}
		return s.AdmitCreate(ctx, manager.Admission{Owner: "t", ID: id, Spec: []byte("{}"), CPUMillis: 100, Memory: 1 << 20, Lease: &l, LeaseTTL: 10 * time.Second})
	}
	if err := s.AdmitCreate(ctx, manager.Admission{Owner: "t", ID: "bad", Spec: []byte("{}"), Lease: &manager.OpLease{ID: "create/bad"}, LeaseTTL: time.Second}); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
		t.Fatalf("admission with a lease without holder: %v, want invalid_argument", err)
	}
	if err := admit("sb-1", "r-1"); err != nil {
		t.Fatal(err)
	}
	l, err := s.Lease(ctx, "create/sb-1")
	if err != nil || l.Holder != "r-1" || l.Attempts != 1 || l.IdemKey != "k-sb-1" || !l.ExpiresAt.Equal(clk.now().Add(10*time.Second)) {
		t.Fatalf("lease of an admitted create: %+v, %v; want r-1's, for 10s, with the key", l, err)
	}
	var qe *manager.QuotaError
	if err := admit("sb-2", "r-1"); !errors.As(err, &qe) {
		t.Fatalf("admission over quota: %v, want a QuotaError", err)
	}
	if _, err := s.Lease(ctx, "create/sb-2"); errdefs.CodeOf(err) != errdefs.CodeNotFound {
		t.Fatalf("lease of a refused create: %v, want none", err)
	}
	if _, err := s.SetQuota(ctx, "t", manager.Quota{Sandboxes: 10, CPUMillis: 1000, MemoryBytes: 1 << 30, DiskBytes: 1 << 30, CreatesPerMin: 100}); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.TakeLease(ctx, manager.OpLease{ID: "create/sb-3", Kind: "create", SandboxID: "sb-3", Owner: "t", Holder: "r-2"}, 5*time.Second); err != nil || !ok {
		t.Fatalf("take: %v, %v", ok, err)
	}
	if err := admit("sb-3", "r-1"); !errors.Is(err, manager.ErrLeaseHeld) || errdefs.CodeOf(err) != errdefs.CodeUnavailable {
		t.Fatalf("admission whose lease r-2 holds: %v, want ErrLeaseHeld (unavailable)", err)
	}
	if _, err := s.OwnedSandbox(ctx, "t", "sb-3"); errdefs.CodeOf(err) != errdefs.CodeNotFound {
		t.Fatalf("create refused for its held lease: %v, want not admitted", err)
	}
	clk.add(6 * time.Second)
	if err := admit("sb-3", "r-1"); err != nil {
		t.Fatalf("admission whose lease expired: %v", err)
	}
	if l, err := s.Lease(ctx, "create/sb-3"); err != nil || l.Holder != "r-1" || l.Attempts != 2 {
		t.Fatalf("lease taken over with the admission: %+v, %v; want r-1's, attempt 2", l, err)
	}
}
