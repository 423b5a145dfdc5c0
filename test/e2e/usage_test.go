package e2e

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/manager"
)

// TestUsageStreamAcrossFailover: ctld@a meters a live guest every 300 ms
// while a manager pulls the stream into its database; ctld@a is killed
// (-9) and ctld@b takes over: the stream's numbers go on from the last
// committed one, the release's final record comes last, and the
// manager's database holds every record once (none lost, none repeated).
func TestUsageStreamAcrossFailover(t *testing.T) {
	e := newEnv(t)
	e.args = append(e.args, "--usage-interval", "300ms")
	e.start("a")
	na := e.waitPrimary("a", 60*time.Second)
	e.start("b")
	c := e.client()
	cx := ctx(t, 3*time.Minute)
	if _, err := c.Claim(cx, "metered", claimReq("claim-metered", 1)); err != nil {
		t.Fatalf("claim: %v", err)
	}
	st, err := manager.OpenStore(cx, filepath.Join(t.TempDir(), "m.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	src := &seenSource{Client: c, seen: map[uint64]api.UsageRecord{}}
	puller := manager.UsagePuller{Store: st, Source: src, Page: 3}
	pctx, stop := context.WithCancel(cx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for pctx.Err() == nil {
			_, _ = puller.PullOnce(pctx) // errors while no primary serves
			time.Sleep(100 * time.Millisecond)
		}
	}()
	time.Sleep(2 * time.Second)
	e.kill9("a")
	nb := e.waitPrimary("b", 60*time.Second)
	time.Sleep(2 * time.Second)
	if _, err := c.Release(cx, "metered", api.ReleaseRequest{OperationID: "release-metered", Generation: 1}); err != nil {
		t.Fatalf("release after failover: %v", err)
	}
	stop()
	wg.Wait()
	if _, err := puller.PullOnce(cx); err != nil {
		t.Fatal(err)
	}
	// The puller acknowledged what it stored: the node keeps none of it.
	if p, err := c.Usage(cx, 0, api.MaxUsageLimit); err != nil || len(p.Records) != 0 || p.Last != uint64(len(src.seen)) {
		t.Fatalf("the node's stream after the pulls: %d records, last %d, %v; want none kept, last %d", len(p.Records), p.Last, err, len(src.seen))
	}
	recs := make([]api.UsageRecord, 0, len(src.seen))
	for seq := uint64(1); seq <= uint64(len(src.seen)); seq++ {
		r, ok := src.seen[seq]
		if !ok {
			t.Fatalf("record %d never reached the puller (it saw %d)", seq, len(src.seen))
		}
		recs = append(recs, r)
	}
	epochs := map[uint64]int{}
	var cpu uint64
	for i, r := range recs {
		if r.Seq != uint64(i+1) || r.SandboxID != "metered" || (r.Final != (i == len(recs)-1)) {
			t.Fatalf("record %d of %d: %+v", i, len(recs), r)
		}
		epochs[r.Epoch]++
		cpu += r.Usage.CPUUsec
	}
	t.Logf("%d records, by epoch %v (a %d, b %d), cpu %d us", len(recs), epochs, na.Epoch, nb.Epoch, cpu)
	if epochs[na.Epoch] == 0 || epochs[nb.Epoch] == 0 || cpu == 0 {
		t.Fatalf("records by epoch %v: want some of each primary (%d, %d); cpu %d", epochs, na.Epoch, nb.Epoch, cpu)
	}
	sums, err := st.SumUsage(cx, manager.UsageQuery{}, true)
	if err != nil || len(sums) != 1 || sums[0].Records != int64(len(recs)) || sums[0].Usage.CPUUsec != cpu {
		t.Fatalf("the manager stored %+v, %v; want the node's %d records once, cpu %d", sums, err, len(recs), cpu)
	}
	if cur, _ := st.UsageCursor(cx, nb.NodeID); cur != uint64(len(recs)) {
		t.Fatalf("manager cursor %d, want %d", cur, len(recs))
	}
}

// seenSource is the node's stream as the puller read it: every record
// it was given, by sequence number.
type seenSource struct {
	*api.Client
	mu   sync.Mutex
	seen map[uint64]api.UsageRecord
}

func (s *seenSource) UsageAck(ctx context.Context, after uint64, limit int) (api.UsagePage, error) {
	p, err := s.Client.UsageAck(ctx, after, limit)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range p.Records {
		s.seen[r.Seq] = r
	}
	return p, err
}
