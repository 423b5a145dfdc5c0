package op

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
)

func testJournal(t *testing.T) *journal.Journal {
	t.Helper()
	j, err := journal.Open(filepath.Join(t.TempDir(), "journal.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	if err := j.TakeOver(1); err != nil {
		t.Fatal(err)
	}
	return j
}

var rec = journal.Sandbox{ID: "sb", Generation: 1, ContainerID: "sb-g1", State: journal.StateClaiming}

// TestMakeAllOneCommitPerEntry: each entry's done record commits with the
// next entry's intended record and with what its make staged; the crash
// points come in the order the journal passes them; at each the journal
// holds what recovery expects (k:done: k done, k+1 intended).
func TestMakeAllOneCommitPerEntry(t *testing.T) {
	j := testJournal(t)
	var points []string
	var states []string // the two entries' records at each point
	r := &Runner{J: j, Epoch: 1, Term: NewTerm(context.Background())}
	r.CrashHook = func(p string) {
		points = append(points, p)
		var st string
		j.View(func(tx *journal.Tx) error {
			for _, k := range []journal.Kind{journal.KindCgroup, journal.KindMount} {
				e, ok, _ := tx.Effect(k, "sb-g1")
				if ok {
					st += string(k) + "=" + string(e.State) + " "
				}
			}
			return nil
		})
		states = append(states, st)
	}
	if err := j.Update(func(tx *journal.Tx) error {
		if err := tx.PutSandbox(rec); err != nil {
			return err
		}
		return tx.PutEffect(r.Intended(journal.KindCgroup, rec)) // the admission's
	}); err != nil {
		t.Fatal(err)
	}
	c0 := j.Commits()
	effects := []Effect{
		{Kind: journal.KindCgroup, Make: func(context.Context) (func(*journal.Tx) error, error) {
			return func(tx *journal.Tx) error {
				return PutGenerationTx(tx, rec, func(s *journal.Sandbox) { s.RootDev = "0:42" })
			}, nil
		}},
		{Kind: journal.KindMount, Make: func(context.Context) (func(*journal.Tx) error, error) { return nil, nil }},
	}
	var steps []journal.Kind
	if err := r.MakeAll(context.Background(), rec, effects, func(k journal.Kind, _ time.Duration) { steps = append(steps, k) }); err != nil {
		t.Fatal(err)
	}
	if c := j.Commits() - c0; c != 2 {
		t.Errorf("two entries took %d commits, want 2", c)
	}
	wantPoints := []string{"cgroup:intended", "cgroup:made", "cgroup:done", "mount:intended", "mount:made", "mount:done"}
	if !slices.Equal(points, wantPoints) {
		t.Errorf("crash points %v, want %v", points, wantPoints)
	}
	wantStates := []string{
		"cgroup=intended ", "cgroup=intended ",
		"cgroup=done mount=intended ", "cgroup=done mount=intended ", "cgroup=done mount=intended ",
		"cgroup=done mount=done ",
	}
	if !slices.Equal(states, wantStates) {
		t.Errorf("journal at the points:\n%q\nwant\n%q", states, wantStates)
	}
	if !slices.Equal(steps, []journal.Kind{journal.KindCgroup, journal.KindMount}) {
		t.Errorf("steps %v", steps)
	}
	j.View(func(tx *journal.Tx) error {
		if s, _, _ := tx.Sandbox("sb"); s.RootDev != "0:42" {
			t.Errorf("the staged write did not commit: %+v", s)
		}
		return nil
	})
}

// TestMakeAllStopsWithTheTerm: an entry whose make ends the term is
// journaled done, the next is neither journaled nor made.
func TestMakeAllStopsWithTheTerm(t *testing.T) {
	j := testJournal(t)
	ctx, end := context.WithCancel(context.Background())
	r := &Runner{J: j, Epoch: 1, Term: NewTerm(ctx)}
	made := 0
	err := r.MakeAll(context.Background(), rec, []Effect{
		{Kind: journal.KindCgroup, Make: func(context.Context) (func(*journal.Tx) error, error) { made++; end(); return nil, nil }},
		{Kind: journal.KindMount, Make: func(context.Context) (func(*journal.Tx) error, error) { made++; return nil, nil }},
	}, func(journal.Kind, time.Duration) {})
	if !errors.Is(err, ErrTermOver) || errdefs.CodeOf(err) != errdefs.CodeUnavailable || made != 1 {
		t.Fatalf("err %v (%s), made %d; want ErrTermOver (unavailable), one make", err, errdefs.CodeOf(err), made)
	}
	var es []journal.Effect
	j.View(func(tx *journal.Tx) (err error) { es, err = tx.Effects(); return err })
	if len(es) != 1 || es[0].Kind != journal.KindCgroup || es[0].State != journal.Done {
		t.Fatalf("effects %+v, want only the cgroup done", es)
	}
}

// TestOpsBeginOnce: an operation id runs once; a retry gets its record, a
// different request under it a conflict, a refusal in create its own kind.
func TestOpsBeginOnce(t *testing.T) {
	j := testJournal(t)
	o := NewOps(j, nil)
	op := journal.Operation{ID: "op1", Kind: journal.OpClaim, RequestHash: "h1", State: journal.OpPending}
	if _, started, err := o.Begin(context.Background(), op, func(*journal.Tx) error { return nil }); err != nil || !started {
		t.Fatalf("first Begin: started %v, %v", started, err)
	}
	o.End("op1")
	op.State = journal.OpDone
	j.Update(func(tx *journal.Tx) error { return tx.PutOperation(op) })
	if prev, started, err := o.Begin(context.Background(), op, nil); err != nil || started || prev.State != journal.OpDone {
		t.Fatalf("retry: %+v started %v, %v", prev, started, err)
	}
	other := op
	other.RequestHash = "h2"
	if _, _, err := o.Begin(context.Background(), other, nil); errdefs.CodeOf(err) != errdefs.CodeConflict {
		t.Fatalf("another request under op1: %v", err)
	}
	refused := errdefs.Errorf(errdefs.CodeCapacityExhausted, "full")
	if _, _, err := o.Begin(context.Background(), journal.Operation{ID: "op2"}, func(*journal.Tx) error { return refused }); err != refused {
		t.Fatalf("refused in create: %v, want the refusal as it is", err)
	}
}

// TestLocksSerialize: a key's lock is held by one at a time and forgotten
// once free.
func TestLocksSerialize(t *testing.T) {
	var l Locks
	unlock := l.Lock("a")
	got := make(chan struct{})
	go func() { u := l.Lock("a"); close(got); u() }()
	select {
	case <-got:
		t.Fatal("a second holder got the lock")
	case <-time.After(20 * time.Millisecond):
	}
	l.Lock("b")() // another key is free
	unlock()
	<-got
	if len(l.m) != 0 {
		t.Fatalf("locks kept after release: %v", l.m)
	}
}

// TestDrainWaits: Drain refuses new operations and returns once those in
// flight are done, or says they still run.
func TestDrainWaits(t *testing.T) {
	ctx, end := context.WithCancel(context.Background())
	term := NewTerm(ctx)
	_, done, err := term.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	end()
	closed := false
	if err := term.Drain(20*time.Millisecond, func() { closed = true }); err == nil || !closed {
		t.Fatalf("Drain with an operation in flight: %v (closing called %v)", err, closed)
	}
	if _, _, err := term.Begin(context.Background()); errdefs.CodeOf(err) != errdefs.CodeNotPrimary {
		t.Fatalf("Begin after the term: %v", err)
	}
	done()
	if err := term.Drain(time.Second, func() {}); err != nil {
		t.Fatal(err)
	}
}

// TestCurrentAndSandbox: a call on a sandbox the journal never saw is
// not_found, on a generation that is not the current one fenced.
func TestCurrentAndSandbox(t *testing.T) {
	j := testJournal(t)
	if err := j.Update(func(tx *journal.Tx) error {
		return tx.PutSandbox(journal.Sandbox{ID: "sb", Generation: 2, State: journal.StateReady, Epoch: 1})
	}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		id   string
		gen  uint64
		want errdefs.Code
	}{{"sb", 0, ""}, {"sb", 2, ""}, {"sb", 1, errdefs.CodeFenced}, {"other", 0, errdefs.CodeNotFound}} {
		err := j.View(func(tx *journal.Tx) error {
			_, err := Current(tx, c.id, c.gen, "release")
			return err
		})
		if got := errdefs.CodeOf(err); (c.want == "" && err != nil) || (c.want != "" && got != c.want) {
			t.Errorf("Current(%s, %d): %v, want %q", c.id, c.gen, err, c.want)
		}
	}
	if s, err := Sandbox(j, "sb"); err != nil || s.Generation != 2 {
		t.Errorf("Sandbox(sb): %+v, %v", s, err)
	}
	if _, err := Sandbox(j, "other"); errdefs.CodeOf(err) != errdefs.CodeNotFound {
		t.Errorf("Sandbox(other): %v, want not_found", err)
	}
}
