package meter

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/journal/journaltest"
	"github.com/ctld/ctld/internal/netpolicy"
)

// writeCgroup renders a lease's cgroup files as the kernel would.
func writeCgroup(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func cgroupFiles(cpu, cur, peak, pids, rbytes, wbytes int) map[string]string {
	return map[string]string{
		"cpu.stat":       "usage_usec " + itoa(cpu) + "\nuser_usec 1\nsystem_usec 2\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n",
		"memory.current": itoa(cur) + "\n",
		"memory.peak":    itoa(peak) + "\n",
		"pids.peak":      itoa(pids) + "\n",
		"io.stat": "254:0 rbytes=" + itoa(rbytes/2) + " wbytes=" + itoa(wbytes) + " rios=3 wios=4 dbytes=0 dios=0\n" +
			"7:1 rbytes=" + itoa(rbytes-rbytes/2) + " wbytes=0 rios=1 wios=0 dbytes=0 dios=0\n",
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func TestReadCgroup(t *testing.T) {
	dir := t.TempDir()
	writeCgroup(t, dir, cgroupFiles(1500, 4096, 8192, 7, 1000, 300))
	c, err := ReadCgroup(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := Cgroup{CPUUsec: 1500, MemoryCurrentBytes: 4096, MemoryPeakBytes: 8192, PIDsPeak: 7, IOReadBytes: 1000, IOWriteBytes: 300}
	if c != want {
		t.Fatalf("ReadCgroup = %+v, want %+v", c, want)
	}
	// A kernel without memory.peak, pids.peak, io.stat: zeros, no error.
	old := t.TempDir()
	writeCgroup(t, old, map[string]string{"cpu.stat": "usage_usec 9\n", "memory.current": "10\n"})
	if c, err := ReadCgroup(old); err != nil || c != (Cgroup{CPUUsec: 9, MemoryCurrentBytes: 10}) {
		t.Fatalf("ReadCgroup(old kernel) = %+v, %v", c, err)
	}
	// A lease that is gone.
	if _, err := ReadCgroup(filepath.Join(dir, "gone")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("ReadCgroup(gone) = %v, want fs.ErrNotExist", err)
	}
	// Garbage is an error, not a zero.
	bad := t.TempDir()
	writeCgroup(t, bad, map[string]string{"cpu.stat": "usage_usec lots\n"})
	if _, err := ReadCgroup(bad); err == nil {
		t.Fatal("ReadCgroup(bad cpu.stat) = nil error")
	}
	huge := t.TempDir()
	writeCgroup(t, huge, map[string]string{"cpu.stat": string(make([]byte, maxCgroupFile+10))})
	if _, err := ReadCgroup(huge); err == nil {
		t.Fatal("ReadCgroup(huge cpu.stat) = nil error")
	}
}

func TestDelta(t *testing.T) {
	prev := journal.Usage{CPUUsec: 100, TxBytes: 50, MemoryPeakBytes: 900, PIDsPeak: 5, WallMS: 1000}
	cur := journal.Usage{CPUUsec: 160, TxBytes: 20, MemoryPeakBytes: 800, MemoryCurrentBytes: 700, PIDsPeak: 6, WallMS: 2000, DiskUsedBytes: 3}
	got := Delta(prev, cur)
	want := journal.Usage{CPUUsec: 60, TxBytes: 20 /* reset */, MemoryPeakBytes: 900, MemoryCurrentBytes: 700, PIDsPeak: 6, WallMS: 1000, DiskUsedBytes: 3}
	if got != want {
		t.Fatalf("Delta = %+v, want %+v", got, want)
	}
}

// rig is a meter over a real journal and fake cgroup files.
type rig struct {
	j      *journal.Journal
	m      *Meter
	root   string
	now    time.Time
	egress netpolicy.Counters
}

func newRig(t *testing.T, keep int) *rig {
	t.Helper()
	j, err := journal.Open(filepath.Join(t.TempDir(), "journal.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	if err := journaltest.TakeOverNext(j); err != nil {
		t.Fatal(err)
	}
	r := &rig{j: j, root: t.TempDir(), now: time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)}
	r.m = New(Deps{
		Journal: j, Epoch: 3,
		CgroupDir: func(id string) string { return filepath.Join(r.root, id) },
		Egress: func(ctx context.Context, s journal.Sandbox) (netpolicy.Counters, bool) {
			return r.egress, s.State == journal.StateReady
		},
		Now: func() time.Time { return r.now },
	}, Retention{Keep: keep})
	return r
}

func (r *rig) put(t *testing.T, s journal.Sandbox) {
	t.Helper()
	if err := r.j.Update(func(tx *journal.Tx) error { return tx.PutSandbox(s) }); err != nil {
		t.Fatal(err)
	}
}

func (r *rig) page(t *testing.T, after uint64, limit int) journal.UsagePage {
	t.Helper()
	p, err := r.m.Page(after, limit, false)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func readySandbox(r *rig, id string, gen uint64) journal.Sandbox {
	return journal.Sandbox{
		ID: id, Generation: gen, State: journal.StateReady, LeaseID: id + "-l",
		CreatedAt: r.now.Add(-10 * time.Second), Timings: journal.Timings{ProofMS: 100, TotalMS: 2000},
	}
}

// TestStream: records at each tick carry what was used since the one
// before; the final record is written once, also when the teardown runs
// again; records are read in order after a cursor.
func TestStream(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, 0)
	s := readySandbox(r, "a", 1)
	r.put(t, s)
	writeCgroup(t, filepath.Join(r.root, "a-l"), cgroupFiles(1000, 100, 200, 3, 10, 20))
	r.egress = netpolicy.Counters{TxBytes: 500, TxPackets: 5}
	if err := r.m.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	r.now = r.now.Add(time.Second)
	writeCgroup(t, filepath.Join(r.root, "a-l"), cgroupFiles(3000, 50, 400, 4, 10, 60))
	r.egress = netpolicy.Counters{TxBytes: 800, TxPackets: 7, DroppedPackets: 1}
	if err := r.m.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	// The teardown begins: the cgroup is still there.
	r.now = r.now.Add(500 * time.Millisecond)
	s.State = journal.StateReleasing
	r.put(t, s)
	writeCgroup(t, filepath.Join(r.root, "a-l"), cgroupFiles(3500, 10, 400, 4, 10, 60))
	if err := r.m.Tick(ctx); err != nil { // not ready: nothing
		t.Fatal(err)
	}
	if err := r.m.Final(ctx, s); err != nil {
		t.Fatal(err)
	}
	// Again (a failover mid-teardown): the cgroup is gone now, and no
	// second final record is written.
	os.RemoveAll(filepath.Join(r.root, "a-l"))
	if err := r.m.Final(ctx, s); err != nil {
		t.Fatal(err)
	}
	p := r.page(t, 0, 100)
	if len(p.Records) != 3 || p.First != 1 || p.Last != 3 {
		t.Fatalf("page = %+v, want 3 records 1..3", p)
	}
	r1, r2, r3 := p.Records[0], p.Records[1], p.Records[2]
	ready := ReadyAt(s)
	if r1.Seq != 1 || r1.Final || r1.Usage.CPUUsec != 1000 || r1.Usage.TxBytes != 500 || !r1.Start.Equal(ready) || r1.Usage.WallMS != 8000 || r1.Epoch != 3 {
		t.Fatalf("first record = %+v", r1)
	}
	if r2.Usage.CPUUsec != 2000 || r2.Usage.TxBytes != 300 || r2.Usage.TxPackets != 2 || r2.Usage.DroppedPackets != 1 ||
		r2.Usage.IOWriteBytes != 40 || r2.Usage.MemoryPeakBytes != 400 || r2.Usage.MemoryCurrentBytes != 50 || r2.Usage.WallMS != 1000 || !r2.Start.Equal(r1.End) {
		t.Fatalf("second record = %+v", r2)
	}
	// Final: the CPU since, the egress unchanged although the chain no
	// longer reads (not ready), nothing taken back.
	if !r3.Final || r3.Usage.CPUUsec != 500 || r3.Usage.TxBytes != 0 || r3.Usage.WallMS != 500 {
		t.Fatalf("final record = %+v", r3)
	}
	if got := r.page(t, 2, 100); len(got.Records) != 1 || got.Records[0].Seq != 3 {
		t.Fatalf("page after 2 = %+v", got)
	}
	if got := r.page(t, 0, 2); len(got.Records) != 2 || got.Records[1].Seq != 2 {
		t.Fatalf("page limit 2 = %+v", got)
	}
	if got := r.page(t, 3, 100); len(got.Records) != 0 || got.Last != 3 {
		t.Fatalf("page after the last = %+v", got)
	}
	// The view of the released generation: the totals the stream ended with.
	s.State = journal.StateReleased
	if u, ok := r.m.Live(ctx, s); !ok || u.CPUUsec != 3500 || u.TxBytes != 800 {
		t.Fatalf("Live(released) = %+v, %v", u, ok)
	}
}

// TestCursorAcrossReopen: the sequence survives the journal being closed
// and opened by the next primary: no number is given twice.
func TestCursorAcrossReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	appendN := func(n int) {
		j, err := journal.Open(path, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer j.Close()
		if err := journaltest.TakeOverNext(j); err != nil {
			t.Fatal(err)
		}
		for range n {
			if err := j.Update(func(tx *journal.Tx) error {
				_, err := tx.AppendUsage(journal.UsageRecord{SandboxID: "a", Generation: 1})
				return err
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	appendN(3)
	// A transaction that fails takes no number a reader sees.
	j, err := journal.Open(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := journaltest.TakeOverNext(j); err != nil {
		t.Fatal(err)
	}
	_ = j.Update(func(tx *journal.Tx) error {
		if _, err := tx.AppendUsage(journal.UsageRecord{SandboxID: "x"}); err != nil {
			return err
		}
		return errors.New("abort")
	})
	j.Close()
	appendN(2)
	j, err = journal.Open(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	var p journal.UsagePage
	if err := j.View(func(tx *journal.Tx) (err error) { p, err = tx.UsageAfter(0, 100); return err }); err != nil {
		t.Fatal(err)
	}
	if len(p.Records) != 5 {
		t.Fatalf("%d records, want 5", len(p.Records))
	}
	for i, rec := range p.Records {
		if rec.Seq != uint64(i+1) || rec.SandboxID != "a" {
			t.Fatalf("record %d = %+v", i, rec)
		}
	}
}

// TestRetention: the oldest records go first; First says where the kept
// ones start, so a reader behind it knows it missed some.
func TestRetention(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, 3)
	r.put(t, readySandbox(r, "a", 1))
	writeCgroup(t, filepath.Join(r.root, "a-l"), cgroupFiles(1, 1, 1, 1, 1, 1))
	for range 5 {
		r.now = r.now.Add(time.Second)
		if err := r.m.Tick(ctx); err != nil {
			t.Fatal(err)
		}
	}
	p := r.page(t, 0, 100)
	// The trim runs after each tick's append: 3 kept.
	if len(p.Records) != 3 || p.First != 3 || p.Last != 5 || p.Records[0].Seq != 3 {
		t.Fatalf("page = first %d last %d, %d records", p.First, p.Last, len(p.Records))
	}
}

// TestRetentionByAck: records stay, however many, until a reader that
// stored them acknowledges them (then the read drops them) or until they
// are older than the retention age unread; a read without ack drops
// nothing.
func TestRetentionByAck(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, 0)
	r.m.ret.MaxAge = time.Hour
	r.put(t, readySandbox(r, "a", 1))
	writeCgroup(t, filepath.Join(r.root, "a-l"), cgroupFiles(1, 1, 1, 1, 1, 1))
	tick := func(n int) {
		for range n {
			r.now = r.now.Add(time.Minute)
			if err := r.m.Tick(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	tick(5)
	// A reader that does not acknowledge (a person with curl) drops nothing.
	if p, err := r.m.Page(3, 100, false); err != nil || p.First != 1 || len(p.Records) != 2 {
		t.Fatalf("read without ack = %+v, %v", p, err)
	}
	if p := r.page(t, 0, 100); p.First != 1 || len(p.Records) != 5 {
		t.Fatalf("after a read without ack: first %d, %d records", p.First, len(p.Records))
	}
	// The manager stored 1..3 and reads after 3 with ack: they go.
	p, err := r.m.Page(3, 100, true)
	if err != nil || len(p.Records) != 2 || p.Records[0].Seq != 4 || p.First != 4 || p.Acked != 3 {
		t.Fatalf("read with ack 3 = %+v, %v", p, err)
	}
	// Unread records stay until they are an hour old, then go by age.
	tick(59)
	if p := r.page(t, 3, 1000); p.First != 4 || p.Last != 64 {
		t.Fatalf("an hour on: first %d last %d", p.First, p.Last)
	}
	tick(2)
	if p := r.page(t, 0, 1000); p.First != 6 || p.Last != 66 {
		t.Fatalf("past the age: first %d last %d, want 6 (4 and 5 aged out)", p.First, p.Last)
	}
}
