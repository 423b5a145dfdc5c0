package node

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/ktest"
)

// TestKernelUsageMetering: on the real kernel a guest that burns CPU,
// allocates memory and sends traffic to an allowed peer shows it in its
// live usage (cpu.stat, memory.peak, its nft chain's counters) and in the
// metering stream; the generation's final record is journaled before its
// cleanup proof (which returns the capacity), once, after every interval
// record of it.
func TestKernelUsageMetering(t *testing.T) {
	ktest.Require(t)
	k := realKernel(t)
	host := ktest.NewTestHost(t, ktest.TestHostOptions{})
	r := newRig(t, k)
	r.mustBoot()
	ctx := context.Background()
	allowed := netip.AddrPortFrom(host.Addr4, host.TCP[0])
	req := claimReq("c1", 1)
	req.Resources.MemoryBytes = 256 << 20
	req.Network = journal.NetworkPolicy{Mode: "restricted", Rules: []journal.NetworkRule{{CIDR: host.Addr4.String() + "/32", Protocol: "tcp", Ports: []string{fmt.Sprint(host.TCP[0])}}}}
	r.mustClaim(sb, req)
	mctx, stop := context.WithCancel(ctx)
	defer stop()
	go r.n.MeterUsage(mctx, 500*time.Millisecond)

	const alloc = 48 << 20
	var out, errb strings.Builder
	burn := fmt.Sprintf("i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; dd if=/dev/zero of=/dev/null bs=%d count=1", alloc)
	if code, err := r.n.Exec(ctx, sb, ExecRequest{Args: []string{"/bin/sh", "-c", burn}}, &out, &errb); err != nil || code != 0 {
		t.Fatalf("burn and allocate in the guest: exit %d, %v; stderr %s", code, err, errb.String())
	}
	if got, ok := guestDial(t, r, allowed); !ok {
		t.Fatalf("dial of the allowed %v answered %q", allowed, got)
	}
	v, err := r.n.Get(ctx, sb)
	if err != nil || v.Usage == nil {
		t.Fatalf("get: %+v, %v", v.Usage, err)
	}
	u := *v.Usage
	t.Logf("live usage: %+v", u)
	if u.CPUUsec == 0 || u.MemoryPeakBytes < alloc || u.TxBytes == 0 || u.TxPackets == 0 || u.WallMS == 0 || u.PIDsPeak == 0 {
		t.Fatalf("live usage after burning CPU, allocating %d bytes and sending egress: %+v", alloc, u)
	}
	// At least one interval record before the release.
	deadline := time.Now().Add(30 * time.Second)
	for {
		p, err := r.n.Usage(ctx, 0, MaxUsagePage, false)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Records) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no interval record within 30 s at a 500 ms interval")
		}
		time.Sleep(200 * time.Millisecond)
	}
	r.mustRelease(sb, "r1", 1)
	pr := r.checkProof("r1")
	time.Sleep(time.Second) // ticks after the release write nothing of it
	p, err := r.n.Usage(ctx, 0, MaxUsagePage, false)
	if err != nil {
		t.Fatal(err)
	}
	var sum journal.Usage
	var finals int
	var last journal.UsageRecord
	for i, rec := range p.Records {
		if rec.SandboxID != sb || rec.Generation != 1 || rec.Seq != uint64(i+1) {
			t.Fatalf("record %d: %+v", i, rec)
		}
		sum.CPUUsec += rec.Usage.CPUUsec
		sum.TxBytes += rec.Usage.TxBytes
		sum.MemoryPeakBytes = max(sum.MemoryPeakBytes, rec.Usage.MemoryPeakBytes)
		if rec.Final {
			finals++
		}
		last = rec
	}
	t.Logf("%d records; summed: cpu %d us, tx %d bytes, memory peak %d; final %+v; proof at %v", len(p.Records), sum.CPUUsec, sum.TxBytes, sum.MemoryPeakBytes, last, pr.Time)
	if finals != 1 || !last.Final {
		t.Fatalf("%d final records, the last is %+v: want one, the last", finals, last)
	}
	if last.End.After(pr.Time) {
		t.Fatalf("final record at %v, after the cleanup proof at %v", last.End, pr.Time)
	}
	if sum.CPUUsec < u.CPUUsec || sum.TxBytes < u.TxBytes || sum.MemoryPeakBytes < alloc {
		t.Fatalf("the stream sums to %+v, below the live usage %+v", sum, u)
	}
	stop()
	r.checkClean("after the release")
}
