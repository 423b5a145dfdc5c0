package journal_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/journal/journaltest"
	"github.com/ctld/ctld/internal/proof"
	bolt "go.etcd.io/bbolt"
)

func open(t testing.TB, path string) *journal.Journal {
	t.Helper()
	j, err := journal.Open(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	if err := journaltest.TakeOverNext(j); err != nil {
		t.Fatal(err)
	}
	return j
}

func newJournal(t testing.TB) *journal.Journal {
	return open(t, filepath.Join(t.TempDir(), "journal.db"))
}

func sb(id string, gen uint64, state journal.State, withheld bool) journal.Sandbox {
	return journal.Sandbox{ID: id, Generation: gen, State: state, Withheld: withheld}
}

func update(t testing.TB, j *journal.Journal, fn func(*journal.Tx) error) {
	t.Helper()
	if err := j.Update(fn); err != nil {
		t.Fatal(err)
	}
}

func liveIDs(t testing.TB, j *journal.Journal) []string {
	t.Helper()
	var out []string
	if err := j.View(func(tx *journal.Tx) error {
		ss, err := tx.LiveSandboxes()
		for _, s := range ss {
			out = append(out, fmt.Sprintf("%s/%d", s.ID, s.Generation))
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func stats(t testing.TB, j *journal.Journal) journal.Stats {
	t.Helper()
	st, err := j.Stats()
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func checkIndex(t testing.TB, j *journal.Journal) {
	t.Helper()
	if err := j.CheckIndex(); err != nil {
		t.Fatalf("index inconsistent: %v", err)
	}
}

// TestLiveIndexFollowsRecords walks one sandbox through its states: it is
// live (what claim, the ledger and reconcile read) until it is finished
// with a clean proof, and enters the history once per generation.
func TestLiveIndexFollowsRecords(t *testing.T) {
	j := newJournal(t)
	steps := []struct {
		rec     journal.Sandbox
		live    string
		history uint64
	}{
		{sb("a", 1, journal.StateClaiming, false), "[a/1]", 0},
		{sb("a", 1, journal.StateReady, false), "[a/1]", 0},
		{sb("a", 1, journal.StateReleasing, false), "[a/1]", 0},
		{sb("a", 1, journal.StateReleased, false), "[]", 1},
		{sb("a", 1, journal.StateReleased, false), "[]", 1}, // re-put: no second entry
		{sb("a", 2, journal.StateClaiming, false), "[a/2]", 1},
		{sb("a", 2, journal.StateFailed, true), "[a/2]", 1}, // withheld capacity stays counted
		{sb("a", 2, journal.StateFailed, false), "[]", 2},   // a later clean proof ends it
		{sb("b", 1, journal.StateLost, false), "[b/1]", 2},
		{sb("c", 7, journal.StateReleased, false), "[b/1]", 3}, // written finished directly
	}
	for i, s := range steps {
		update(t, j, func(tx *journal.Tx) error { return tx.PutSandbox(s.rec) })
		if got := fmt.Sprint(liveIDs(t, j)); got != s.live {
			t.Fatalf("step %d (%s %s withheld=%v): live %v, want %v", i, s.rec.ID, s.rec.State, s.rec.Withheld, got, s.live)
		}
		if h := stats(t, j).History; h != s.history {
			t.Fatalf("step %d: %d history entries, want %d", i, h, s.history)
		}
		checkIndex(t, j)
	}

	// Operations: only pending ones are in the pending index.
	op := journal.Operation{ID: "op1", Kind: "claim", State: journal.OpPending}
	update(t, j, func(tx *journal.Tx) error { return tx.PutOperation(op) })
	var pending []journal.Operation
	j.View(func(tx *journal.Tx) (err error) { pending, err = tx.PendingOperations(); return err })
	if len(pending) != 1 || pending[0].ID != "op1" || stats(t, j).Pending != 1 {
		t.Fatalf("pending = %+v", pending)
	}
	op.State = journal.OpDone
	update(t, j, func(tx *journal.Tx) error { return tx.PutOperation(op) })
	update(t, j, func(tx *journal.Tx) error { return tx.PutOperation(op) })
	if st := stats(t, j); st.Pending != 0 || st.History != 4 {
		t.Fatalf("after the operation finished (twice): %+v, want 0 pending, 4 history", st)
	}
	checkIndex(t, j)
}

// TestIndexRollsBackWithTransaction: a failed transaction leaves neither
// the record nor its index entry (bbolt rolls both back).
func TestIndexRollsBackWithTransaction(t *testing.T) {
	j := newJournal(t)
	boom := errors.New("boom")
	err := j.Update(func(tx *journal.Tx) error {
		if err := tx.PutSandbox(sb("a", 1, journal.StateClaiming, false)); err != nil {
			return err
		}
		if err := tx.PutOperation(journal.Operation{ID: "op", State: journal.OpPending}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if st := stats(t, j); st != (journal.Stats{}) {
		t.Fatalf("a rolled-back transaction left index entries: %+v", st)
	}
	checkIndex(t, j)
}

// TestIndexConsistentAfterKill kills a process that writes claims and
// releases as fast as it can (SIGKILL, at a random point of a commit) and
// checks the indexes match the records after each crash.
func TestIndexConsistentAfterKill(t *testing.T) {
	if path := os.Getenv("JOURNAL_TEST_WRITER"); path != "" {
		writeForever(path)
		return
	}
	path := filepath.Join(t.TempDir(), "journal.db")
	var before journal.Stats
	for round := 0; round < 3; round++ {
		cmd := exec.Command(os.Args[0], "-test.run=^TestIndexConsistentAfterKill$")
		cmd.Env = append(os.Environ(), "JOURNAL_TEST_WRITER="+path, fmt.Sprintf("JOURNAL_TEST_ROUND=%d", round))
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Kill it mid-write, after its first writes committed: a fixed
		// sleep from the start is too short on a loaded machine.
		wrote := make(chan error, 1)
		go func() {
			line, err := bufio.NewReader(out).ReadString('\n')
			if err == nil && line != "wrote\n" {
				err = fmt.Errorf("writer said %q", line)
			}
			wrote <- err
			_, _ = io.Copy(io.Discard, out)
		}()
		select {
		case err := <-wrote:
			if err != nil {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				t.Fatalf("round %d: writer: %v", round, err)
			}
		case <-time.After(2 * time.Minute):
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("round %d: the writer committed nothing within 2m", round)
		}
		time.Sleep(time.Duration(50+100*round) * time.Millisecond)
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
		j, err := journal.Open(path, time.Second)
		if err != nil {
			t.Fatalf("round %d: open after kill: %v", round, err)
		}
		if err := j.CheckIndex(); err != nil {
			t.Fatalf("round %d: index inconsistent after SIGKILL: %v", round, err)
		}
		st, _ := j.Stats()
		j.Close()
		if st == before {
			t.Fatalf("round %d: the writer wrote nothing before it was killed (%+v)", round, st)
		}
		t.Logf("round %d: %+v", round, st)
		before = st
	}
}

func writeForever(path string) {
	j, err := journal.Open(path, 5*time.Second)
	if err == nil {
		err = journaltest.TakeOverNext(j)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	round := os.Getenv("JOURNAL_TEST_ROUND")
	for i := 0; ; i++ {
		id := fmt.Sprintf("r%s-%d", round, i%50)
		gen := uint64(i/50 + 1)
		op := journal.Operation{ID: fmt.Sprintf("op-r%s-%d", round, i), State: journal.OpPending, Generation: gen}
		steps := []func(*journal.Tx) error{
			func(tx *journal.Tx) error {
				if err := tx.PutOperation(op); err != nil {
					return err
				}
				return tx.PutSandbox(sb(id, gen, journal.StateClaiming, false))
			},
			func(tx *journal.Tx) error {
				op.State = journal.OpDone
				if err := tx.PutOperation(op); err != nil {
					return err
				}
				return tx.PutSandbox(sb(id, gen, journal.StateReady, false))
			},
			func(tx *journal.Tx) error {
				if err := tx.PutProof(proof.Proof{OperationID: op.ID, Generation: gen}); err != nil {
					return err
				}
				return tx.PutSandbox(sb(id, gen, journal.StateReleased, i%7 == 0))
			},
		}
		for _, s := range steps {
			if err := j.Update(s); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(2)
			}
		}
		if i == 0 {
			fmt.Println("wrote")
		}
		if i%20 == 0 {
			if _, err := j.Prune(journal.Retention{MaxRecords: 100}, time.Now(), 16); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(2)
			}
		}
	}
}

// TestPruneByAge: history older than the retention goes in bounded
// batches; live records, pending operations and young history stay.
func TestPruneByAge(t *testing.T) {
	j := newJournal(t)
	if err := journaltest.SeedFinished(j, "old", 100); err != nil {
		t.Fatal(err)
	}
	update(t, j, func(tx *journal.Tx) error {
		if err := tx.PutSandbox(sb("live", 1, journal.StateReady, false)); err != nil {
			return err
		}
		if err := tx.PutSandbox(sb("held", 1, journal.StateReleased, true)); err != nil {
			return err
		}
		return tx.PutOperation(journal.Operation{ID: "pending-op", State: journal.OpPending})
	})
	st := stats(t, j)
	if st.History != 400 || st.Live != 2 || st.Pending != 1 {
		t.Fatalf("seeded: %+v, want 400 history (4 per generation), 2 live, 1 pending", st)
	}
	r := journal.Retention{MaxAge: 24 * time.Hour}
	if res, err := j.Prune(r, time.Now().Add(time.Hour), 50); err != nil || res.Pruned != 0 {
		t.Fatalf("prune within the window: %+v, %v", res, err)
	}
	later := time.Now().Add(25 * time.Hour)
	var batches, total int
	for {
		res, err := j.Prune(r, later, 64)
		if err != nil {
			t.Fatal(err)
		}
		if res.Pruned > 64 {
			t.Fatalf("batch of %d exceeds 64", res.Pruned)
		}
		batches++
		total += res.Pruned
		checkIndex(t, j)
		if !res.More {
			break
		}
	}
	if total != 400 || batches != 7 {
		t.Fatalf("pruned %d in %d batches, want 400 in 7", total, batches)
	}
	err := j.View(func(tx *journal.Tx) error {
		all, err := tx.Sandboxes()
		if err != nil {
			return err
		}
		if len(all) != 2 {
			return fmt.Errorf("%d sandbox records left, want the live and the withheld one", len(all))
		}
		if _, ok, _ := tx.Proof("release-old5"); ok {
			return errors.New("proof of a pruned generation still there")
		}
		if _, ok, _ := tx.Operation("claim-old5"); ok {
			return errors.New("operation of a pruned generation still there")
		}
		if _, ok, _ := tx.Operation("pending-op"); !ok {
			return errors.New("pending operation pruned")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestPruneByRecordCount keeps the newest MaxRecords and reports those
// pruned before MaxAge (their operation ids lose idempotency early).
func TestPruneByRecordCount(t *testing.T) {
	j := newJournal(t)
	if err := journaltest.SeedFinished(j, "a", 10); err != nil {
		t.Fatal(err)
	}
	if err := journaltest.SeedFinished(j, "b", 10); err != nil {
		t.Fatal(err)
	}
	res, err := j.Prune(journal.Retention{MaxAge: time.Hour, MaxRecords: 40}, time.Now(), 1000)
	if err != nil || res.Pruned != 40 || res.Early != 40 || res.More || res.Remaining != 40 {
		t.Fatalf("prune = %+v, %v; want 40 pruned early, 40 left", res, err)
	}
	checkIndex(t, j)
	j.View(func(tx *journal.Tx) error {
		if _, ok, _ := tx.Sandbox("a9"); ok {
			t.Error("oldest generation a9 kept")
		}
		if _, ok, _ := tx.Sandbox("b0"); !ok {
			t.Error("newer generation b0 pruned")
		}
		return nil
	})
}

// TestPruneKeepsReclaimedSandbox: pruning generation 1's history never
// deletes the record of a later generation of the same sandbox, live or
// finished.
func TestPruneKeepsReclaimedSandbox(t *testing.T) {
	j := newJournal(t)
	put := func(s journal.Sandbox) { update(t, j, func(tx *journal.Tx) error { return tx.PutSandbox(s) }) }
	put(sb("s", 1, journal.StateReleased, false))
	put(sb("s", 2, journal.StateReady, false))
	later := time.Now().Add(48 * time.Hour)
	if res, err := j.Prune(journal.Retention{MaxAge: time.Hour}, later, 10); err != nil || res.Pruned != 1 {
		t.Fatalf("prune = %+v, %v", res, err)
	}
	if got := liveIDs(t, j); fmt.Sprint(got) != "[s/2]" {
		t.Fatalf("live after prune: %v", got)
	}
	put(sb("s", 3, journal.StateClaiming, false))
	put(sb("s", 3, journal.StateReleased, false))
	put(sb("s", 4, journal.StateReleased, false)) // two finished generations in history
	// Keep one record: generation 3's entry goes, generation 4's record stays.
	if res, err := j.Prune(journal.Retention{MaxRecords: 1}, later, 10); err != nil || res.Pruned != 1 {
		t.Fatalf("prune = %+v, %v", res, err)
	}
	j.View(func(tx *journal.Tx) error {
		if s, ok, _ := tx.Sandbox("s"); !ok || s.Generation != 4 {
			t.Fatalf("record of generation 4 = %+v, %v", s, ok)
		}
		return nil
	})
	checkIndex(t, j)
}

// TestOpenIndexesAnOldJournal: a journal written before the indexes
// existed is indexed once, when it is opened.
func TestOpenIndexesAnOldJournal(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		recs := map[string]map[string]string{
			"sandboxes": {
				"live": `{"id":"live","generation":3,"state":"ready"}`,
				"held": `{"id":"held","generation":1,"state":"released","withheld":true}`,
				"gone": `{"id":"gone","generation":1,"state":"released"}`,
			},
			"operations": {
				"p": `{"id":"p","state":"pending"}`,
				"d": `{"id":"d","state":"done"}`,
			},
			"proofs":  {"d": `{"operation_id":"d"}`},
			"effects": {},
		}
		for name, kv := range recs {
			b, err := tx.CreateBucket([]byte(name))
			if err != nil {
				return err
			}
			for k, v := range kv {
				if err := b.Put([]byte(k), []byte(v)); err != nil {
					return err
				}
			}
		}
		return nil
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	j := open(t, path)
	checkIndex(t, j)
	if got := liveIDs(t, j); fmt.Sprint(got) != "[held/1 live/3]" {
		t.Fatalf("live = %v", got)
	}
	if st := stats(t, j); st.Pending != 1 || st.History != 3 {
		t.Fatalf("stats = %+v, want 1 pending, 3 history (gone, d, proof d)", st)
	}
}
