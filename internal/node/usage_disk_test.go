package node

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestUsageBlockDisk: a block generation's disk_used_bytes is what its
// writer's dirty file takes on the node (the chunks the guest wrote), live
// in GET, in the interval records and in the final record, which is
// sampled before the teardown stops the writer.
func TestUsageBlockDisk(t *testing.T) {
	ctx := context.Background()
	tk, _ := blockKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	r.mustClaim(sb, blockReq("c1", 1))
	s := r.sandbox(sb)
	writeFakeCgroup(t, tk.leases.Dir(s.LeaseID), 1000, 8<<20)
	// The writer's dirty file (cowdev's "dirty" in its dir): a sparse file
	// of the device's size with three 64 KiB chunks written.
	w, ok := r.n.blockRoot().Writers().Get(s, "")
	if !ok {
		t.Fatal("no writer journaled")
	}
	f, err := os.Create(filepath.Join(w.Dir, "dirty"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(64 << 20); err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{0, 5 << 20, 40 << 20} {
		if _, err := f.WriteAt(make([]byte, 64<<10), off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	fi, err := f.Stat()
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	want := uint64(fi.Sys().(*syscall.Stat_t).Blocks) * 512
	if want < 3*64<<10 {
		t.Fatalf("the dirty file takes %d bytes; want at least its three chunks", want)
	}
	if err := r.n.meter.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	v, err := r.n.Get(ctx, sb)
	if err != nil || v.Usage == nil || v.Usage.DiskUsedBytes != want {
		t.Fatalf("live usage = %+v, %v; want disk used %d", v.Usage, err, want)
	}
	r.mustRelease(sb, "r1", 1)
	p, err := r.n.Usage(ctx, 0, 100, false)
	if err != nil || len(p.Records) != 2 {
		t.Fatalf("usage records: %+v, %v; want the tick's and the final one", p, err)
	}
	for _, rec := range p.Records {
		if rec.Usage.DiskUsedBytes != want {
			t.Errorf("record %d (final %v): disk used %d, want %d", rec.Seq, rec.Final, rec.Usage.DiskUsedBytes, want)
		}
	}
}
