package nft

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/netpolicy"
)

// BenchmarkApply measures the firewall's work per generation when the
// table holds 1 and then 500 other generations: Apply of a new generation
// (create), Apply again with another policy (replace), Remove, and the
// cleanup proof's CheckGone. Each change is one transaction; what can grow
// with the table is the reads around it.
// Prints p50/p99 per step and the ratio 500/1. Run:
// make bench VM_PKGS=./internal/netpolicy/nft BENCH=Apply
// (CTLD_BENCH_APPLIES rounds per size, default 20).
func BenchmarkApply(b *testing.B) {
	ktest.Require(b)
	ktest.CheckLeaks(b, ktest.SnapshotOptions{})
	rounds := 20
	if v, err := fmt.Sscan(os.Getenv("CTLD_BENCH_APPLIES"), &rounds); v != 1 || err != nil || rounds < 1 {
		rounds = 20
	}
	ctx := context.Background()
	pool := netpolicy.Pool{V4: netip.MustParsePrefix("10.200.0.0/16")}
	fw, err := New(Config{DNSPort: 5353, Pool: pool}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := ktest.DeleteNftTable(fw.table().Name); err != nil {
			b.Errorf("delete table: %v", err)
		}
	})
	if err := fw.Ensure(ctx); err != nil {
		b.Fatal(err)
	}
	owner := func(slot int) netpolicy.Owner {
		blk, err := pool.Block(netpolicy.Slot(slot))
		if err != nil {
			b.Fatal(err)
		}
		return netpolicy.Owner{ID: fmt.Sprintf("bench-%d", slot), Generation: 1, Block: blk}
	}
	rules := func(port string) []netpolicy.RuleSpec {
		return []netpolicy.RuleSpec{
			{CIDR: "203.0.113.0/24", Protocol: "tcp", Ports: []string{"443", port}},
			{CIDR: "198.51.100.7/32"},
			{CIDR: "8.8.8.8/32", Protocol: "udp", Ports: []string{"53"}},
			{Domain: "*.example.com", Protocol: "tcp", Ports: []string{"443"}},
		}
	}
	eff := func(o netpolicy.Owner, port string) netpolicy.Effective {
		p, err := netpolicy.ParseDefault("network", netpolicy.Spec{Mode: "restricted", Rules: rules(port)})
		if err != nil {
			b.Fatal(err)
		}
		return netpolicy.Resolve(p, netpolicy.Facts{Pool: pool, Block: o.Block})
	}
	existing := 0
	fill := func(n int) {
		for ; existing < n; existing++ {
			o := owner(1000 + existing)
			if err := fw.Apply(ctx, o, eff(o, "8443")); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Cleanup(func() {
		for i := range existing {
			if err := fw.Remove(ctx, owner(1000+i)); err != nil {
				b.Errorf("remove: %v", err)
			}
		}
	})
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	res := map[int]map[string][]float64{}
	steps := []string{"create", "replace", "remove", "check"}
	b.ResetTimer()
	for _, size := range []int{1, 500} {
		b.StopTimer()
		fill(size)
		b.StartTimer()
		res[size] = map[string][]float64{}
		for i := range rounds {
			o := owner(1 + i)
			t0 := time.Now()
			if err := fw.Apply(ctx, o, eff(o, "8443")); err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			if err := fw.Apply(ctx, o, eff(o, "9443")); err != nil {
				b.Fatal(err)
			}
			t2 := time.Now()
			if err := fw.Remove(ctx, o); err != nil {
				b.Fatal(err)
			}
			t3 := time.Now()
			if ok, detail := fw.CheckGone(ctx, o); !ok {
				b.Fatalf("after Remove: %s", detail)
			}
			res[size]["check"] = append(res[size]["check"], ms(time.Since(t3)))
			res[size]["create"] = append(res[size]["create"], ms(t1.Sub(t0)))
			res[size]["replace"] = append(res[size]["replace"], ms(t2.Sub(t1)))
			res[size]["remove"] = append(res[size]["remove"], ms(t3.Sub(t2)))
		}
	}
	b.StopTimer()
	for _, s := range steps {
		one, many := res[1][s], res[500][s]
		b.Logf("nft %-7s with 1: p50 %7.2f p99 %7.2f ms | with 500: p50 %7.2f p99 %7.2f ms | ratio p50 %.2f p99 %.2f (n=%d)",
			s, pct(one, 50), pct(one, 99), pct(many, 50), pct(many, 99), pct(many, 50)/pct(one, 50), pct(many, 99)/pct(one, 99), len(one))
		b.ReportMetric(pct(many, 50)/pct(one, 50), s+"-500/1-p50")
	}
}

// pct is the p-th percentile (nearest rank) of v.
func pct(v []float64, p int) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	i := (p*len(s) + 99) / 100
	return s[max(i-1, 0)]
}
