package nodeagent_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/manager"
	"github.com/ctld/ctld/internal/manager/fakenode"
	"github.com/ctld/ctld/internal/nodeagent"
	"github.com/ctld/ctld/internal/pgtest"
)

// BenchmarkPlacedCreateVsDirect: what the fleet's path adds to a create,
// against a fake ctld that answers at once: a fleet Manager's Create
// (placement transaction, NOTIFY, the node process's pickup and record,
// the manager's wait) against the same claim sent to the ctld directly.
// Reports both p50s; the difference is the fleet's overhead per create.
func BenchmarkPlacedCreateVsDirect(b *testing.B) {
	ctx := context.Background()
	srv := pgtest.Start(b)
	dsn := srv.NewDatabase(b)
	st, err := manager.Open(ctx, dsn, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	agentStore, err := manager.Open(ctx, dsn, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer agentStore.Close()
	f := fakenode.New("node-a")
	socket := fakenode.Serve(b, f)
	a := &nodeagent.Agent{Store: agentStore, Client: &api.Client{SocketPath: socket}, Templates: []string{"busybox"},
		MaxSandboxes: 1 << 20, TTL: 10 * time.Second, Poll: time.Second, ListenDSN: dsn}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(rctx) }()
	defer func() { cancel(); <-done }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := st.FleetNode(ctx, "node-a"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("node not registered")
		}
	}
	time.Sleep(200 * time.Millisecond) // LISTEN in place
	m := &manager.Manager{Store: st, Fleet: &manager.Fleet{}}
	direct := &api.Client{SocketPath: socket}
	spec := manager.Spec{Resources: api.Resources{CPUMillis: 10, MemoryBytes: 1 << 20, PIDs: 8}, RootFS: api.RootFS{Mode: api.RootFSOverlay, Template: "busybox"}}
	var placed, straight []time.Duration
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		if _, err := m.Create(ctx, fmt.Sprintf("p%d", i), spec); err != nil {
			b.Fatal(err)
		}
		placed = append(placed, time.Since(start))
		start = time.Now()
		if _, err := direct.Claim(ctx, fmt.Sprintf("d%d", i), api.ClaimRequest{OperationID: fmt.Sprintf("op-d%d", i), Generation: 1,
			RootFS: spec.RootFS, Resources: spec.Resources}); err != nil {
			b.Fatal(err)
		}
		straight = append(straight, time.Since(start))
	}
	b.StopTimer()
	p := func(d []time.Duration, q float64) time.Duration {
		s := slices.Clone(d)
		slices.Sort(s)
		return s[int(q*float64(len(s)-1))]
	}
	b.ReportMetric(float64(p(placed, 0.5).Microseconds()), "placed-p50-µs")
	b.ReportMetric(float64(p(straight, 0.5).Microseconds()), "direct-p50-µs")
	b.ReportMetric(float64(p(placed, 0.99).Microseconds()), "placed-p99-µs")
}
