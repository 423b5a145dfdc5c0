package journal

import (
	"path/filepath"
	"testing"
	"time"
)

// TestHeadMarkOnlyRises: a volume's mark moves up only, and survives the
// journal being closed and opened again (a takeover).
func TestHeadMarkOnlyRises(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j.db")
	j, err := Open(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := j.TakeOver(1); err != nil {
		t.Fatal(err)
	}
	for _, s := range []struct{ seq, gen uint64 }{{2, 5}, {1, 1}, {2, 9}} {
		if err := j.Update(func(tx *Tx) error { _, err := tx.RaiseHeadMark("volumes/data", s.seq, s.gen); return err }); err != nil {
			t.Fatal(err)
		}
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if j, err = Open(path, time.Second); err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	var m, none HeadMark
	err = j.View(func(tx *Tx) (err error) {
		if m, err = tx.HeadMark("volumes/data"); err != nil {
			return err
		}
		none, err = tx.HeadMark("volumes/other")
		return err
	})
	if err != nil || m.Seq != 2 || m.Generation != 5 || none.Seq != 0 {
		t.Fatalf("marks %+v, %+v, %v; want 2 (generation 5) and none", m, none, err)
	}
}
