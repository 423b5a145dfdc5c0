package op

import (
	"context"
	"fmt"
	"time"

	"github.com/ctld/ctld/internal/journal"
)

// Runner makes a generation's kernel effects, each journaled before and
// after it is made, within the term, passing the crash points.
type Runner struct {
	J     *journal.Journal
	Epoch uint64
	Term  *Term
	// CrashHook, when set, is called at each crash point ("cgroup:intended",
	// "cgroup:made", ...) so tests can kill the process there. nil in
	// production.
	CrashHook func(point string)
}

// Crash passes crash point point.
func (r *Runner) Crash(point string) {
	if r.CrashHook != nil {
		r.CrashHook(point)
	}
}

// Intended is the effect record of kind for rec's generation, intended.
func (r *Runner) Intended(kind journal.Kind, rec journal.Sandbox) journal.Effect {
	return journal.Effect{Kind: kind, Name: rec.ContainerID, SandboxID: rec.ID, Generation: rec.Generation, State: journal.Intended, Epoch: r.Epoch, Slot: rec.Slot}
}

// An Effect is one entry of a generation as the runner makes it.
type Effect struct {
	Kind journal.Kind
	// Make makes the entry's object. It may return a journal write that
	// commits with the entry's done record (nil: none), so a record of
	// what it made costs no commit of its own.
	Make func(ctx context.Context) (withDone func(*journal.Tx) error, err error)
}

// MakeAll makes rec's effects in order, each journaled before and after
// its kernel effect: intended before it is made, done after. The done
// record of an entry and the intended record of the next commit in one
// transaction, and the first entry's intended record must have committed
// with the claim's admission (Intended): a crash at k:done leaves k+1
// intended, the state a crash at k+1:intended leaves, so recovery is the
// same with half the commits. step is called with each entry's make time
// (its commit included).
func (r *Runner) MakeAll(ctx context.Context, rec journal.Sandbox, effects []Effect, step func(journal.Kind, time.Duration)) error {
	for i, e := range effects {
		if err := r.Term.Live(); err != nil {
			return err
		}
		r.Crash(string(e.Kind) + ":intended")
		if err := r.Term.Live(); err != nil {
			return err
		}
		t0 := time.Now()
		withDone, err := e.Make(ctx)
		if err != nil {
			return err
		}
		r.Crash(string(e.Kind) + ":made")
		done := r.Intended(e.Kind, rec)
		done.State = journal.Done
		var next *journal.Effect
		if i+1 < len(effects) && r.Term.Live() == nil {
			n := r.Intended(effects[i+1].Kind, rec)
			next = &n
		}
		err = r.J.Update(func(tx *journal.Tx) error {
			if err := tx.PutEffect(done); err != nil {
				return err
			}
			if withDone != nil {
				if err := withDone(tx); err != nil {
					return err
				}
			}
			if next != nil {
				return tx.PutEffect(*next)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("journal %s %s done: %w", e.Kind, done.Name, err)
		}
		step(e.Kind, time.Since(t0))
		r.Crash(string(e.Kind) + ":done")
	}
	return nil
}

// PutGeneration rewrites rec's generation's sandbox record in one
// transaction: also (if any) first, since it may fill in what set then
// records (the epochs).
func PutGeneration(j *journal.Journal, rec journal.Sandbox, also func(*journal.Tx) error, set func(*journal.Sandbox)) error {
	return j.Update(func(tx *journal.Tx) error {
		if _, err := generation(tx, rec); err != nil {
			return err
		}
		if also != nil {
			if err := also(tx); err != nil {
				return err
			}
		}
		return PutGenerationTx(tx, rec, set)
	})
}

// PutGenerationTx rewrites rec's generation's sandbox record in tx; it
// fails if the record moved on to another generation.
func PutGenerationTx(tx *journal.Tx, rec journal.Sandbox, set func(*journal.Sandbox)) error {
	s, err := generation(tx, rec)
	if err != nil {
		return err
	}
	set(&s)
	return tx.PutSandbox(s)
}

// generation reads rec's sandbox record, which must still be rec's
// generation.
func generation(tx *journal.Tx, rec journal.Sandbox) (journal.Sandbox, error) {
	s, ok, err := tx.Sandbox(rec.ID)
	if err != nil {
		return s, err
	}
	if !ok || s.Generation != rec.Generation {
		return s, fmt.Errorf("sandbox %s generation %d vanished from the journal", rec.ID, rec.Generation)
	}
	return s, nil
}
