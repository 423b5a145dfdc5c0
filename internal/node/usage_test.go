package node

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/netpolicy"
)

func writeFakeCgroup(t *testing.T, dir string, cpuUsec, peak int) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]string{
		"cpu.stat":       "usage_usec " + strconv.Itoa(cpuUsec) + "\n",
		"memory.current": "4096\n",
		"memory.peak":    strconv.Itoa(peak) + "\n",
		"pids.peak":      "3\n",
		"io.stat":        "254:0 rbytes=10 wbytes=20 rios=1 wios=1 dbytes=0 dios=0\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestUsageFinalRecordBeforeTeardown: a ready generation is metered live
// (GET) and at each tick; its final record, with what it used since the
// last tick (its nft counters read while it is releasing), is journaled
// before the teardown's first step, so before anything of it is removed
// and its capacity can come back. The stream reads in order.
func TestUsageFinalRecordBeforeTeardown(t *testing.T) {
	ctx := context.Background()
	tk, k := fakeKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	r.mustClaim(sb, claimReq("c1", 1))
	s := r.sandbox(sb)
	dir := tk.leases.Dir(s.LeaseID)
	writeFakeCgroup(t, dir, 1000, 8<<20)
	k.SetCounters(netpolicy.ChainName(sb, 1), netpolicy.Counters{TxBytes: 500, TxPackets: 5})
	if err := r.n.meter.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	v, err := r.n.Get(ctx, sb)
	if err != nil || v.Usage == nil || v.Usage.CPUUsec != 1000 || v.Usage.MemoryPeakBytes != 8<<20 || v.Usage.TxBytes != 500 || v.Usage.PIDsPeak != 3 {
		t.Fatalf("live usage = %+v, %v", v.Usage, err)
	}
	writeFakeCgroup(t, dir, 3000, 9<<20)
	k.SetCounters(netpolicy.ChainName(sb, 1), netpolicy.Counters{TxBytes: 800, TxPackets: 8})

	var mu sync.Mutex
	var first string
	var atFirst journal.UsagePage
	r.pause = func(p string) {
		mu.Lock()
		defer mu.Unlock()
		if first != "" || !isTeardownPoint(p) {
			return
		}
		first = p
		atFirst, err = r.n.Usage(ctx, 0, 100, false)
		if err != nil {
			t.Errorf("read usage at %s: %v", p, err)
		}
	}
	r.mustRelease(sb, "r1", 1)
	r.checkProof("r1")
	if first == "" {
		t.Fatal("no teardown point passed")
	}
	if n := len(atFirst.Records); n != 2 || !atFirst.Records[1].Final {
		t.Fatalf("at %s (the teardown's first step) the stream has %+v; want the tick's record and the final one", first, atFirst.Records)
	}
	fin := atFirst.Records[1]
	if fin.Usage.CPUUsec != 2000 || fin.Usage.TxBytes != 300 || fin.Usage.TxPackets != 3 || fin.Usage.MemoryPeakBytes != 9<<20 || fin.Seq != 2 {
		t.Fatalf("final record = %+v", fin)
	}
	// Nothing more is written of it (a tick, a repeat of the release).
	if err := r.n.meter.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	r.mustRelease(sb, "r1", 1)
	if p, _ := r.n.Usage(ctx, 0, 100, false); len(p.Records) != 2 || p.Last != 2 {
		t.Fatalf("after the release: %+v", p)
	}
	// The released generation's view keeps the totals it ended with.
	if v, err := r.n.Get(ctx, sb); err != nil || v.Usage == nil || v.Usage.CPUUsec != 3000 || v.Usage.TxBytes != 800 {
		t.Fatalf("released view usage = %+v, %v", v.Usage, err)
	}
	if _, err := r.n.Usage(ctx, 0, MaxUsagePage+1, false); err == nil {
		t.Fatal("a page above the bound was served")
	}
}

// TestUsageCursorAcrossFailover: the next primary (a new term over the
// same journal at the next epoch) goes on with the stream's numbers and
// with what the last record said: no record lost, repeated or counted
// twice. A primary that dies mid-teardown, after the final record, leaves
// the next one nothing to write of the generation: one final record.
func TestUsageCursorAcrossFailover(t *testing.T) {
	ctx := context.Background()
	tk, k := fakeKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	r.mustClaim(sb, claimReq("c1", 1))
	dir := tk.leases.Dir(r.sandbox(sb).LeaseID)
	chain := netpolicy.ChainName(sb, 1)
	step := func(cpu int, tx uint64) {
		t.Helper()
		writeFakeCgroup(t, dir, cpu, 1<<20)
		k.SetCounters(chain, netpolicy.Counters{TxBytes: tx})
		if err := r.n.meter.Tick(ctx); err != nil {
			t.Fatal(err)
		}
	}
	step(1000, 10)
	step(2500, 30)
	r.mustBoot() // ctld@a's term ends; ctld@b takes the journal over
	step(4000, 70)
	r.arm("runsc:removing")
	if _, _, returned := r.release(sb, "r1", 1); returned {
		t.Fatal("the release did not crash at runsc:removing")
	}
	r.mustBoot() // the next primary completes the teardown
	r.checkProof("r1")
	p, err := r.n.Usage(ctx, 0, 100, false)
	if err != nil {
		t.Fatal(err)
	}
	var cpu, tx uint64
	var epochs []uint64
	finals := 0
	for i, rec := range p.Records {
		if rec.Seq != uint64(i+1) {
			t.Fatalf("record %d has seq %d: %+v", i, rec.Seq, p.Records)
		}
		cpu += rec.Usage.CPUUsec
		tx += rec.Usage.TxBytes
		epochs = append(epochs, rec.Epoch)
		if rec.Final {
			finals++
		}
	}
	if len(p.Records) != 4 || finals != 1 || !p.Records[3].Final || cpu != 4000 || tx != 70 {
		t.Fatalf("stream across two failovers: %d records, %d final, cpu %d, tx %d: %+v", len(p.Records), finals, cpu, tx, p.Records)
	}
	if epochs[0] != 1 || epochs[1] != 1 || epochs[2] != 2 || epochs[3] != 2 {
		t.Fatalf("epochs %v, want [1 1 2 2]", epochs)
	}
}
