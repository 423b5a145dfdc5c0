package node

import (
	"context"
	"sync"
	"testing"

	"github.com/ctld/ctld/internal/journal"
)

// breakMark replaces generation gen of id's usage mark with one a newer
// ctld wrote (this one cannot read it: no record of the generation can be
// journaled) and returns the mark it replaced.
func breakMark(t *testing.T, r *rig, id string, gen uint64) journal.UsageMark {
	t.Helper()
	var m journal.UsageMark
	err := r.n.d.Journal.Update(func(tx *journal.Tx) error {
		var err error
		if m, _, err = tx.UsageMark(id, gen); err != nil {
			return err
		}
		return tx.PutRawUsageMark(id, gen, []byte(`{"record_version":99}`))
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func fixMark(t *testing.T, r *rig, m journal.UsageMark) {
	t.Helper()
	if err := r.n.d.Journal.Update(func(tx *journal.Tx) error { return tx.PutUsageMark(m) }); err != nil {
		t.Fatal(err)
	}
}

func usageRecords(t *testing.T, r *rig) []journal.UsageRecord {
	t.Helper()
	p, err := r.n.Usage(context.Background(), 0, 100, false)
	if err != nil {
		t.Fatal(err)
	}
	return p.Records
}

// TestUsageFinalRecordFailClosed: a final usage record that cannot be
// journaled as the teardown begins is written with the cleanup proof,
// from the totals read before anything was removed; one that cannot be
// journaled at all keeps the proof out, so the generation's capacity
// does not come back without its usage (the release fails; the next
// primary completes it once the record can be written).
func TestUsageFinalRecordFailClosed(t *testing.T) {
	ctx := context.Background()
	tk, _ := fakeKernel(t)
	r := newRig(t, tk)
	r.mustBoot()

	// The write fails at the teardown's start, works by its proof.
	r.mustClaim(sb, claimReq("c1", 1))
	dir := tk.leases.Dir(r.sandbox(sb).LeaseID)
	writeFakeCgroup(t, dir, 1000, 1<<20)
	if err := r.n.meter.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	writeFakeCgroup(t, dir, 3000, 1<<20)
	good := breakMark(t, r, sb, 1)
	var once sync.Once
	r.pause = func(p string) {
		if isTeardownPoint(p) {
			once.Do(func() { fixMark(t, r, good) })
		}
	}
	r.mustRelease(sb, "r1", 1)
	r.pause = nil
	r.checkProof("r1")
	recs := usageRecords(t, r)
	if len(recs) != 2 || !recs[1].Final || recs[1].Usage.CPUUsec != 2000 {
		t.Fatalf("stream = %+v; want the tick's record and a final one with the 2000 us used since, read before the teardown", recs)
	}

	// The write fails throughout: no proof, the generation holds its
	// capacity (releasing), no final record.
	r.mustClaim(sb, claimReq("c2", 2))
	dir = tk.leases.Dir(r.sandbox(sb).LeaseID)
	writeFakeCgroup(t, dir, 500, 1<<20)
	if err := r.n.meter.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	good = breakMark(t, r, sb, 2)
	if _, err, returned := r.release(sb, "r2", 2); !returned || err == nil {
		t.Fatalf("release without its final usage record: returned %v, err %v; want an error", returned, err)
	}
	if _, err := r.n.Proof(ctx, "r2"); err == nil {
		t.Fatal("a cleanup proof was journaled without the generation's final usage record")
	}
	if s := r.sandbox(sb); s.State != journal.StateReleasing {
		t.Fatalf("sandbox after the failed release: %s, want releasing (its capacity held)", s.State)
	}
	if recs := usageRecords(t, r); len(recs) != 3 || recs[2].Final {
		t.Fatalf("stream = %+v; want no final record of generation 2 yet", recs)
	}
	// Readable again: the next primary's reconcile completes the
	// release, final record and proof together.
	fixMark(t, r, good)
	r.mustBoot()
	r.checkProof("r2")
	if recs := usageRecords(t, r); len(recs) != 4 || !recs[3].Final || recs[3].Generation != 2 {
		t.Fatalf("stream after the takeover = %+v; want generation 2's final record", recs)
	}
	r.checkClean("after the takeover")
}
