package journal

import (
	"errors"
	"path/filepath"
	"testing"
	"time"
)

func openTest(t *testing.T, path string) *Journal {
	t.Helper()
	j, err := Open(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	return j
}

func sandboxIDs(t *testing.T, j *Journal) []string {
	t.Helper()
	var ids []string
	if err := j.View(func(tx *Tx) error {
		ss, err := tx.Sandboxes()
		for _, s := range ss {
			ids = append(ids, s.ID)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return ids
}

func putSandbox(j *Journal, id string) error {
	return j.Update(func(tx *Tx) error { return tx.PutSandbox(Sandbox{ID: id}) })
}

// TestStaleHandleWritesRefused: a second primary takes the journal over
// while the first still has it open (possible wherever the bbolt flock does
// not exclude: a replaced file, a filesystem whose flock is not a local
// kernel lock). Every write of the stale handle is refused with a typed
// fenced error, inside its own transaction, and changes nothing.
func TestStaleHandleWritesRefused(t *testing.T) {
	stale := openTest(t, filepath.Join(t.TempDir(), "journal.db"))
	if err := stale.TakeOver(1); err != nil {
		t.Fatal(err)
	}
	if err := putSandbox(stale, "before"); err != nil {
		t.Fatalf("write of the current term: %v", err)
	}
	// The fake second primary: its own handle on the same database.
	current := &Journal{db: stale.db}
	if err := current.TakeOver(2); err != nil {
		t.Fatalf("take over at epoch 2: %v", err)
	}
	err := putSandbox(stale, "stale")
	var fe *FencedError
	if !errors.Is(err, ErrFenced) || !errors.As(err, &fe) || fe.Writer != 1 || fe.Current != 2 {
		t.Fatalf("stale write = %v, want FencedError{Writer 1, Current 2}", err)
	}
	if err := stale.Heartbeat(time.Now()); !errors.Is(err, ErrFenced) {
		t.Fatalf("stale heartbeat = %v, want fenced", err)
	}
	// Re-taking its old epoch does not revive the stale handle.
	if err := stale.TakeOver(1); !errors.Is(err, ErrEpochBehind) {
		t.Fatalf("stale TakeOver(1) = %v, want ErrEpochBehind", err)
	}
	if err := putSandbox(stale, "stale2"); !errors.Is(err, ErrFenced) {
		t.Fatalf("stale write after a refused TakeOver = %v, want fenced", err)
	}
	if err := putSandbox(current, "after"); err != nil {
		t.Fatalf("write of the current term: %v", err)
	}
	if err := current.Heartbeat(time.Now()); err != nil {
		t.Fatalf("heartbeat of the current term: %v", err)
	}
	if got := sandboxIDs(t, current); len(got) != 2 || got[0] != "after" || got[1] != "before" {
		t.Fatalf("sandboxes = %v, want [after before]: a fenced write changed the journal", got)
	}
	if e, err := current.Epoch(); err != nil || e != 2 {
		t.Fatalf("journal epoch = %d, %v; want 2", e, err)
	}
}

// TestTakeOverRefusesRolledBackEpoch: the journal remembers its epoch across
// reopens; a term whose ha/epoch is not above it (the epoch file was rolled
// back) is refused and cannot write.
func TestTakeOverRefusesRolledBackEpoch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	j, err := Open(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := putSandbox(j, "x"); !errors.Is(err, ErrFenced) {
		t.Fatalf("write before TakeOver = %v, want fenced", err)
	}
	if err := j.TakeOver(5); err != nil {
		t.Fatal(err)
	}
	if err := j.TakeOver(5); err != nil {
		t.Fatalf("TakeOver twice by the same handle: %v", err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	j = openTest(t, path)
	for _, e := range []uint64{4, 5} {
		if err := j.TakeOver(e); !errors.Is(err, ErrEpochBehind) {
			t.Fatalf("TakeOver(%d) over journal epoch 5 = %v, want ErrEpochBehind", e, err)
		}
		if err := putSandbox(j, "x"); !errors.Is(err, ErrFenced) {
			t.Fatalf("write after refused TakeOver(%d) = %v, want fenced", e, err)
		}
	}
	if got := sandboxIDs(t, j); len(got) != 0 {
		t.Fatalf("refused terms wrote %v", got)
	}
	if err := j.TakeOver(6); err != nil {
		t.Fatalf("TakeOver(6): %v", err)
	}
	if err := putSandbox(j, "x"); err != nil {
		t.Fatal(err)
	}
}

// TestOpenTimesOutBehindHolder: a standby must not block forever behind a
// process that holds the journal (bbolt's flock).
func TestOpenTimesOutBehindHolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	openTest(t, path)
	start := time.Now()
	j, err := Open(path, 200*time.Millisecond)
	if err == nil {
		j.Close()
		t.Fatal("second Open succeeded while the first holds the journal")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Open took %v despite a 200ms timeout", d)
	}
	if _, err := Open(path, 0); err == nil {
		t.Fatal("Open without a timeout accepted")
	}
}

// TestNextWriterEpochGrows: writer epochs only grow, in one journal,
// across terms (a new primary never hands out an epoch again).
func TestNextWriterEpochGrows(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j.db")
	var last uint64
	for term := uint64(1); term <= 3; term++ {
		j, err := Open(path, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := j.TakeOver(term); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			var e uint64
			if err := j.Update(func(tx *Tx) (err error) { e, err = tx.NextWriterEpoch(); return err }); err != nil {
				t.Fatal(err)
			}
			if e <= last {
				t.Fatalf("term %d: writer epoch %d after %d", term, e, last)
			}
			last = e
		}
		j.Close()
	}
	if last != 6 {
		t.Errorf("last writer epoch %d, want 6", last)
	}
}
