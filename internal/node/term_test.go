package node

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/op"
	"github.com/ctld/ctld/internal/node/resource"
	"github.com/ctld/ctld/internal/proof"
)

func termNode(t *testing.T) (*Node, context.CancelFunc) {
	t.Helper()
	n := testNode(t)
	term, end := context.WithCancel(context.Background())
	t.Cleanup(end)
	n.d.Term = term
	n.term = op.NewTerm(term)
	n.run.Term = n.term
	return n, end
}

// TestNoEffectAfterTermEnds: once the term is over, an effect is neither
// journaled nor made, and a teardown (a rollback or a release) stops
// before its first removal and leaves the generation as it is for the next
// primary's reconcile: no proof, no final state.
func TestNoEffectAfterTermEnds(t *testing.T) {
	n, end := termNode(t)
	rec := journal.Sandbox{
		ID: "sb", Generation: 1, State: journal.StateClaiming, ContainerID: "sb-g1", LeaseID: "sb-g1",
		ClaimOp: "op1",
	}
	if err := n.d.Journal.Update(func(tx *journal.Tx) error { return tx.PutSandbox(rec) }); err != nil {
		t.Fatal(err)
	}
	made := 0
	// The first entry's make ends the term: its done record is journaled,
	// the second entry is neither journaled nor made.
	tab := []entry{
		fnResource{journal.KindCgroup, func() error { made++; end(); return nil }},
		fnResource{journal.KindMount, func() error { made++; return nil }},
	}
	err := n.run.MakeAll(context.Background(), rec, effects(tab, &resource.Claim{Rec: rec}), func(journal.Kind, time.Duration) {})
	if !errors.Is(err, ErrTermOver) || made != 1 {
		t.Fatalf("effect after the term: err %v, made %d times; want ErrTermOver and no second make", err, made)
	}
	var effects []journal.Effect
	n.d.Journal.View(func(tx *journal.Tx) (err error) { effects, err = tx.Effects(); return err })
	if len(effects) != 1 || effects[0].Kind != journal.KindCgroup || effects[0].State != journal.Done {
		t.Fatalf("effects = %+v, want only the cgroup done (nothing journaled after the term)", effects)
	}
	// The deps are nil: a teardown that touched the kernel would panic.
	if _, err := n.teardown(context.Background(), rec, "op1", journal.StateFailed, "rollback"); !errors.Is(err, ErrTermOver) {
		t.Fatalf("teardown after the term = %v, want ErrTermOver", err)
	}
	if s, _ := n.sandbox("sb"); s.State != journal.StateClaiming {
		t.Fatalf("teardown after the term changed the state to %s", s.State)
	}
	if _, err := n.Proof(context.Background(), "op1"); errdefs.CodeOf(err) != errdefs.CodeNotFound {
		t.Fatalf("teardown after the term stored a proof (%v)", err)
	}
	if err := n.WriteFile(context.Background(), "sb", "/x", nil); errdefs.CodeOf(err) != errdefs.CodeNotPrimary {
		t.Fatalf("files write after the term = %v, want not_primary", err)
	}
}

// TestDrainWaitsForOperationsInFlight: Drain refuses new operations and
// returns only when those in flight returned (bounded), so the lock is
// released after the last effect.
// fnResource is an entry whose make is f (and nothing else).
type fnResource struct {
	k journal.Kind
	f func() error
}

func (r fnResource) Spec() resource.Spec                             { return resource.Spec{Kind: r.k} }
func (r fnResource) Make(context.Context, *resource.Claim) error     { return r.f() }
func (fnResource) Remove(context.Context, journal.Sandbox) error     { return nil }
func (fnResource) Gone(context.Context, journal.Sandbox) proof.Check { return proof.Check{OK: true} }

func TestDrainWaitsForOperationsInFlight(t *testing.T) {
	n, end := termNode(t)
	ctx, done, err := n.begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	end()
	select {
	case <-ctx.Done():
	case <-time.After(time.Second):
		t.Fatal("an operation's context did not end with the term")
	}
	if err := n.Drain(100 * time.Millisecond); err == nil {
		t.Fatal("Drain returned while an operation is in flight")
	}
	if _, _, err := n.begin(context.Background()); errdefs.CodeOf(err) != errdefs.CodeNotPrimary {
		t.Fatalf("begin after the term = %v, want not_primary", err)
	}
	done()
	if err := n.Drain(time.Second); err != nil {
		t.Fatalf("Drain after the last operation returned: %v", err)
	}
}

// TestJournalErrorsKeepTheirKind: a fenced journal and the end of the
// term keep their kind through the wrapping (errdefs.CodeOf at the edge),
// and a transaction's own refusal is answered as it is.
func TestJournalErrorsKeepTheirKind(t *testing.T) {
	fenced := &journal.FencedError{Writer: 3, Current: 4}
	for err, want := range map[error]errdefs.Code{
		fenced: errdefs.CodeFenced,
		errors.Join(errors.New("journal"), fenced): errdefs.CodeFenced,
		ErrTermOver:                errdefs.CodeUnavailable,
		errors.New("disk on fire"): errdefs.CodeInternal,
	} {
		if got := errdefs.CodeOf(err); got != want {
			t.Errorf("CodeOf(%v) = %s, want %s", err, got, want)
		}
		wrapped := txErr("x", err)
		if got := errdefs.CodeOf(wrapped); got != want {
			t.Errorf("CodeOf(txErr(%v)) = %s, want %s", err, got, want)
		}
		if !errors.Is(wrapped, err) {
			t.Errorf("txErr(%v) lost its cause", err)
		}
	}
	refused := errdefs.Errorf(errdefs.CodeConflict, "no longer ready")
	if got := txErr("x", fmt.Errorf("in tx: %w", refused)); got != refused {
		t.Errorf("txErr of a refusal = %v, want the refusal as it is", got)
	}
}
