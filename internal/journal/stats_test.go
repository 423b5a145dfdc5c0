package journal

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

// TestOnCommitAndSize: the OnCommit hook hears each committed Update
// (not a failed one, not a View) with its duration, and Size follows the
// database file as it grows.
func TestOnCommitAndSize(t *testing.T) {
	j := newTaken(t)
	var seen []time.Duration
	j.OnCommit(func(d time.Duration) { seen = append(seen, d) })
	before, err := j.Size()
	if err != nil || before <= 0 {
		t.Fatalf("Size of a new journal = %d, %v", before, err)
	}
	big := strings.Repeat("x", 1<<20)
	mustUpdate(t, j, func(tx *Tx) error { return tx.PutSandbox(Sandbox{ID: "a", Generation: 1, Reason: big}) })
	_ = j.Update(func(*Tx) error { return errors.New("rolled back") })
	mustView(t, j, func(*Tx) error { return nil })
	if len(seen) != 1 || seen[0] <= 0 {
		t.Fatalf("OnCommit heard %v, want one positive duration", seen)
	}
	after, err := j.Size()
	if err != nil || after < before+1<<20 {
		t.Fatalf("Size after a 1 MiB record = %d (before %d), %v", after, before, err)
	}
	if st, err := os.Stat(j.db.Path()); err != nil || st.Size() != after {
		t.Fatalf("Size %d, file %v (%v)", after, st, err)
	}
}
