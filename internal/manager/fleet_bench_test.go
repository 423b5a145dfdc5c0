package manager_test

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/manager"
	"github.com/ctld/ctld/internal/pgtest"
)

// BenchmarkPlacePostgres measures placement on a real PostgreSQL: creates
// from 8 goroutines over 1 or 2 store handles (manager replicas), on three
// large nodes already holding `preload` reservations. It reports creates/s
// and the p50/p99 latency of one Place.
//
//	go test -run '^$' -bench BenchmarkPlacePostgres -benchtime 400x ./internal/manager
func BenchmarkPlacePostgres(b *testing.B) {
	srv := pgtest.Start(b)
	for _, c := range []struct{ handles, preload int }{{1, 100}, {2, 100}, {1, 10000}} {
		b.Run(fmt.Sprintf("handles=%d/preload=%d", c.handles, c.preload), func(b *testing.B) {
			ctx := context.Background()
			dsn := srv.NewDatabase(b)
			var stores []*manager.Store
			for range c.handles {
				s, err := manager.Open(ctx, dsn, nil)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { s.Close() })
				stores = append(stores, s)
			}
			big := manager.NodeAlloc{CPUMillis: 1 << 40, MemoryBytes: 1 << 50, DiskBytes: 1 << 50, Sandboxes: 1 << 30}
			for i := range 3 {
				pub, _, _ := ed25519.GenerateKey(nil)
				if _, err := stores[0].RegisterNode(ctx, manager.Registration{NodeID: fmt.Sprintf("n%d", i), PublicKey: pub, Allocatable: big,
					RootModes: []string{"overlay"}, TTL: time.Hour}); err != nil {
					b.Fatal(err)
				}
			}
			spec := manager.Spec{Resources: api.Resources{CPUMillis: 100, MemoryBytes: 64 << 20, PIDs: 32}, RootFS: api.RootFS{Mode: api.RootFSOverlay}}
			for i := range c.preload {
				if _, err := stores[0].Place(ctx, manager.PlaceIntent{SandboxID: fmt.Sprintf("pre%d", i), OperationID: fmt.Sprintf("cpre%d", i), Spec: spec}); err != nil {
					b.Fatal(err)
				}
			}
			var next atomic.Int64
			var mu sync.Mutex
			var lat []time.Duration
			b.ResetTimer()
			began := time.Now()
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s := stores[g%len(stores)]
					for {
						i := next.Add(1)
						if i > int64(b.N) {
							return
						}
						id := fmt.Sprintf("b%d", i)
						t0 := time.Now()
						for {
							_, err := s.Place(ctx, manager.PlaceIntent{SandboxID: id, OperationID: "c" + id, Spec: spec})
							if err == nil {
								break
							}
							if errdefs.RetryAfterOf(err) == 0 {
								b.Error(err)
								return
							}
						}
						d := time.Since(t0)
						mu.Lock()
						lat = append(lat, d)
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			el := time.Since(began)
			b.StopTimer()
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			if len(lat) > 0 {
				b.ReportMetric(float64(len(lat))/el.Seconds(), "creates/s")
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
			}
		})
	}
}
