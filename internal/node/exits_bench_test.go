package node

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/journal"
)

// BenchmarkExitToRelease compares, in one run on the fake kernel, the
// latency from a guest's exit to its released record under on_exit
// release (the watch's wake, the exit's journal write, the release) with
// a release call alone on a ready generation. Run with
// -bench ExitToRelease -benchtime 50x; it reports p50 and p99 of each.
func BenchmarkExitToRelease(b *testing.B) {
	tk, k := fakeKernel(b)
	tk.exitPoll = time.Second // wakes come from inotify on the agent dir
	r := newRig(b, tk)
	r.mustBoot()
	var onExit, alone []time.Duration
	for i := 0; i < b.N; i++ {
		id := fmt.Sprintf("ex%d", i)
		req := claimReq("c-"+id, 1)
		req.OnExit = journal.OnExitRelease
		cid := r.mustClaim(id, req).Sandbox.ContainerID
		start := time.Now()
		if err := k.ExitGuest(cid, 0); err != nil {
			b.Fatal(err)
		}
		for r.sandbox(id).State != journal.StateReleased {
			time.Sleep(50 * time.Microsecond)
			if time.Since(start) > 10*time.Second {
				b.Fatalf("%s not released on exit", id)
			}
		}
		onExit = append(onExit, time.Since(start))

		id = fmt.Sprintf("rl%d", i)
		r.mustClaim(id, claimReq("c-"+id, 1))
		start = time.Now()
		r.mustRelease(id, "r-"+id, 1)
		alone = append(alone, time.Since(start))
	}
	p := func(ds []time.Duration, q float64) float64 {
		s := slices.Clone(ds)
		slices.Sort(s)
		return float64(s[min(len(s)-1, int(q*float64(len(s))))].Microseconds()) / 1000
	}
	b.ReportMetric(p(onExit, 0.5), "onexit-p50-ms")
	b.ReportMetric(p(onExit, 0.99), "onexit-p99-ms")
	b.ReportMetric(p(alone, 0.5), "release-p50-ms")
	b.ReportMetric(p(alone, 0.99), "release-p99-ms")
	b.ReportMetric(0, "ns/op")
}
