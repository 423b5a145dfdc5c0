package journal

import (
	"fmt"
	"testing"
	"time"
)

var usageT0 = time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)

// appendUsage appends n records, one a minute from usageT0 on (the
// record numbered s ends at usageT0 + s minutes).
func appendUsage(t *testing.T, j *Journal, n int) {
	t.Helper()
	mustUpdate(t, j, func(tx *Tx) error {
		for range n {
			r := UsageRecord{SandboxID: "sb-0123456789abcdef", Generation: 1, Epoch: 1}
			seq, err := tx.AppendUsage(r)
			if err != nil {
				return err
			}
			r.Seq, r.End = seq, usageT0.Add(time.Duration(seq)*time.Minute)
			r.Start = r.End.Add(-time.Minute)
			if err := put(tx.tx, bucketUsage, string(seqKey(seq)), r); err != nil {
				return err
			}
		}
		return nil
	})
}

func usagePage(t *testing.T, j *Journal) UsagePage {
	t.Helper()
	var p UsagePage
	mustView(t, j, func(tx *Tx) (err error) { p, err = tx.UsageAfter(0, 1<<20); return err })
	return p
}

func trimUsage(t *testing.T, j *Journal, r UsageRetention) int {
	t.Helper()
	var n int
	mustUpdate(t, j, func(tx *Tx) (err error) { n, err = tx.TrimUsage(r, 1<<20); return err })
	return n
}

// TestUsageRetention: a record goes once a reader acknowledged it, or
// once it is older than the retention age unread; an unread young record
// stays however many there are; the kept numbers stay contiguous.
func TestUsageRetention(t *testing.T) {
	j := newTaken(t)
	appendUsage(t, j, 10)
	// Nothing acknowledged, nothing old: all stay (no count bound).
	if n := trimUsage(t, j, UsageRetention{Before: usageT0}); n != 0 {
		t.Fatalf("trimmed %d unread young records", n)
	}
	// A reader acknowledges 4: 1..4 go.
	mustUpdate(t, j, func(tx *Tx) error {
		a, err := tx.AckUsage(4, usageT0)
		if err != nil || a != 4 {
			return fmt.Errorf("ack 4 = %d, %v", a, err)
		}
		// It only moves up.
		if a, err := tx.AckUsage(2, usageT0); err != nil || a != 4 {
			return fmt.Errorf("ack 2 after 4 = %d, %v", a, err)
		}
		return nil
	})
	if n := trimUsage(t, j, UsageRetention{Before: usageT0}); n != 4 {
		t.Fatalf("trimmed %d, want the 4 acknowledged", n)
	}
	if p := usagePage(t, j); p.First != 5 || p.Last != 10 || len(p.Records) != 6 || p.Acked != 4 {
		t.Fatalf("after the ack: first %d last %d acked %d, %d records", p.First, p.Last, p.Acked, len(p.Records))
	}
	// Unread records past the age go (5 and 6 ended before +6m30s), the
	// younger ones stay.
	if n := trimUsage(t, j, UsageRetention{Before: usageT0.Add(6*time.Minute + 30*time.Second)}); n != 2 {
		t.Fatalf("trimmed %d by age, want 2", n)
	}
	if p := usagePage(t, j); p.First != 7 || len(p.Records) != 4 {
		t.Fatalf("after the age: first %d, %d records", p.First, len(p.Records))
	}
	// A cursor past the newest record acknowledges only what exists:
	// records written later are not taken as read.
	mustUpdate(t, j, func(tx *Tx) error {
		a, err := tx.AckUsage(1000, usageT0)
		if err != nil || a != 10 {
			return fmt.Errorf("ack 1000 = %d, %v; want 10", a, err)
		}
		return nil
	})
	appendUsage(t, j, 3)
	if n := trimUsage(t, j, UsageRetention{Before: usageT0}); n != 4 {
		t.Fatalf("trimmed %d, want 7..10", n)
	}
	if p := usagePage(t, j); p.First != 11 || p.Last != 13 || len(p.Records) != 3 {
		t.Fatalf("after acknowledging past the end: first %d last %d, %d records", p.First, p.Last, len(p.Records))
	}
	// The count bound, when set, drops unread records too.
	if n := trimUsage(t, j, UsageRetention{Keep: 1}); n != 2 {
		t.Fatalf("trimmed %d with keep 1, want 2", n)
	}
}

// TestUsageJournalSize measures the journal holding 100,000 records
// (100 ticks of 1,000) with a reader that acknowledges after each tick,
// against one that keeps them all (the count-only retention before).
func TestUsageJournalSize(t *testing.T) {
	const ticks, per = 100, 1000
	size := func(ack bool) int64 {
		j := newTaken(t)
		defer j.Close()
		for range ticks {
			appendUsage(t, j, per)
			if ack {
				mustUpdate(t, j, func(tx *Tx) error {
					if _, err := tx.AckUsage(1<<62, usageT0); err != nil {
						return err
					}
					_, err := tx.TrimUsage(UsageRetention{Before: usageT0}, 1024)
					return err
				})
			}
		}
		if p := usagePage(t, j); p.Last != ticks*per || (ack && len(p.Records) != 0) || (!ack && len(p.Records) != ticks*per) {
			t.Fatalf("ack %v: last %d, %d records kept", ack, p.Last, len(p.Records))
		}
		n, err := j.Size()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	all, acked := size(false), size(true)
	t.Logf("journal with %d records: %d bytes kept all, %d bytes acknowledged per tick", ticks*per, all, acked)
	if acked*10 > all {
		t.Fatalf("acknowledged journal %d bytes, not a tenth of %d", acked, all)
	}
}
