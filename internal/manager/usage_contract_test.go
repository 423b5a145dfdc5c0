package manager_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/manager"
)

// usageContract: the usage store on one backend (runContracts runs it on
// SQLite and on a real PostgreSQL).
func usageContract(t *testing.T, b backend) {
	t0 := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	rec := func(seq uint64, sb string, end time.Time, cpu, tx, peak uint64) api.UsageRecord {
		return api.UsageRecord{Seq: seq, SandboxID: sb, Generation: 1, Start: end.Add(-time.Second), End: end,
			Usage: api.Usage{CPUUsec: cpu, TxBytes: tx, MemoryPeakBytes: peak, WallMS: 1000}}
	}
	t.Run("CursorOutbox", func(t *testing.T) {
		ctx := context.Background()
		s, _ := b.open(t, nil)
		page := []api.UsageRecord{rec(1, "a", t0, 10, 1, 5), rec(2, "a", t0.Add(time.Second), 20, 2, 7)}
		if n, err := s.StoreUsage(ctx, "node-1", page, 2); err != nil || n != 2 {
			t.Fatalf("StoreUsage = %d, %v", n, err)
		}
		// The same page again (a puller that died before it saw the
		// commit) stores nothing; an overlapping one only what is new.
		if n, err := s.StoreUsage(ctx, "node-1", page, 2); err != nil || n != 0 {
			t.Fatalf("StoreUsage(repeat) = %d, %v", n, err)
		}
		if n, err := s.StoreUsage(ctx, "node-1", append(page, rec(3, "a", t0.Add(2*time.Second), 30, 3, 6)), 3); err != nil || n != 1 {
			t.Fatalf("StoreUsage(overlap) = %d, %v", n, err)
		}
		// A cursor behind the stored one does not move it back.
		if _, err := s.StoreUsage(ctx, "node-1", nil, 1); err != nil {
			t.Fatal(err)
		}
		if c, err := s.UsageCursor(ctx, "node-1"); err != nil || c != 3 {
			t.Fatalf("cursor = %d, %v; want 3", c, err)
		}
		// Another node's stream has its own cursor and numbers.
		if n, err := s.StoreUsage(ctx, "node-2", []api.UsageRecord{rec(1, "b", t0, 1, 1, 1)}, 1); err != nil || n != 1 {
			t.Fatalf("StoreUsage(node-2) = %d, %v", n, err)
		}
		sums, err := s.SumUsage(ctx, manager.UsageQuery{}, true)
		if err != nil {
			t.Fatal(err)
		}
		if len(sums) != 2 || sums[0].SandboxID != "a" || sums[0].Records != 3 || sums[0].Usage.CPUUsec != 60 || sums[0].Usage.TxBytes != 6 ||
			sums[0].Usage.MemoryPeakBytes != 7 || sums[0].Usage.WallMS != 3000 {
			t.Fatalf("sums = %+v", sums)
		}
	})
	t.Run("ConcurrentPullers", func(t *testing.T) {
		// Two replicas store the same pages at once: every record once,
		// the cursor at the end.
		ctx := context.Background()
		s1, another := b.open(t, nil)
		s2 := another()
		var pages [][]api.UsageRecord
		for p := range 10 {
			var page []api.UsageRecord
			for i := range 5 {
				seq := uint64(p*5 + i + 1)
				page = append(page, rec(seq, "a", t0.Add(time.Duration(seq)*time.Second), 1, 1, 1))
			}
			pages = append(pages, page)
		}
		var wg sync.WaitGroup
		errs := make(chan error, 20)
		for _, s := range []*manager.Store{s1, s2} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for _, p := range pages {
					if _, err := s.StoreUsage(ctx, "n", p, p[len(p)-1].Seq); err != nil {
						errs <- err
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		sums, err := s1.SumUsage(ctx, manager.UsageQuery{}, true)
		if err != nil || len(sums) != 1 || sums[0].Records != 50 || sums[0].Usage.CPUUsec != 50 {
			t.Fatalf("sums = %+v, %v; want 50 records once each", sums, err)
		}
		if c, err := s2.UsageCursor(ctx, "n"); err != nil || c != 50 {
			t.Fatalf("cursor = %d, %v", c, err)
		}
	})
	t.Run("SumsPerOwnerAndRange", func(t *testing.T) {
		ctx := context.Background()
		s, _ := b.open(t, nil)
		for _, o := range []string{"team-a", "team-b"} {
			if _, err := s.CreateOwner(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
		for owner, ids := range map[string][]string{"team-a": {"a1", "a2"}, "team-b": {"b1"}} {
			for _, id := range ids {
				if err := s.AdmitCreate(ctx, manager.Admission{Owner: owner, ID: id, Spec: []byte("{}")}); err != nil {
					t.Fatal(err)
				}
			}
		}
		var page []api.UsageRecord
		seq := uint64(0)
		for _, id := range []string{"a1", "a2", "b1", "cli"} {
			for i := range 3 { // records ending at t0+1s, +2s, +3s
				seq++
				page = append(page, rec(seq, id, t0.Add(time.Duration(i+1)*time.Second), 100, 10, uint64(i+1)))
			}
		}
		if _, err := s.StoreUsage(ctx, "n", page, seq); err != nil {
			t.Fatal(err)
		}
		// (t0+1s, t0+3s]: two records of each sandbox.
		q := manager.UsageQuery{Since: t0.Add(time.Second), Until: t0.Add(3 * time.Second)}
		owners, err := s.SumUsage(ctx, q, false)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, o := range owners {
			got[o.Owner] = fmt.Sprintf("%d/%d/%d/%d", o.Records, o.Usage.CPUUsec, o.Usage.TxBytes, o.Usage.MemoryPeakBytes)
		}
		want := map[string]string{"": "2/200/20/3", "team-a": "4/400/40/3", "team-b": "2/200/20/3"}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("per owner = %v, want %v", got, want)
		}
		q.Owner = "team-a"
		sbs, err := s.SumUsage(ctx, q, true)
		if err != nil || len(sbs) != 2 || sbs[0].SandboxID != "a1" || sbs[1].SandboxID != "a2" || sbs[1].Usage.CPUUsec != 200 {
			t.Fatalf("team-a per sandbox = %+v, %v", sbs, err)
		}
		sb, err := s.SumUsage(ctx, manager.UsageQuery{SandboxID: "b1"}, true)
		if err != nil || len(sb) != 1 || sb[0].Owner != "team-b" || sb[0].Records != 3 {
			t.Fatalf("b1 = %+v, %v", sb, err)
		}
	})
	t.Run("IdleEgress", func(t *testing.T) {
		ctx := context.Background()
		s, _ := b.open(t, nil)
		if _, err := s.CreateOwner(ctx, "t"); err != nil {
			t.Fatal(err)
		}
		if err := s.AdmitCreate(ctx, manager.Admission{Owner: "t", ID: "x", Spec: []byte("{}"), Idle: time.Minute, Deadline: time.Now().Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
		for i, c := range []struct {
			total uint64
			grew  bool
		}{{0, false}, {100, true}, {100, false}, {50, true} /* a resumed generation's counter */, {50, false}, {1 << 63, true}} {
			if grew, err := s.SeeIdleEgress(ctx, "x", c.total); err != nil || grew != c.grew {
				t.Fatalf("step %d: SeeIdleEgress(%d) = %v, %v; want %v", i, c.total, grew, err, c.grew)
			}
		}
		if grew, err := s.SeeIdleEgress(ctx, "no-timer", 10); err != nil || grew {
			t.Fatalf("a sandbox without an idle timer: %v, %v", grew, err)
		}
	})
}
