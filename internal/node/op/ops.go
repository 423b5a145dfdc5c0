package op

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
)

// Ops are the operation records of mutating calls: one run per operation
// id, and its answer stored for the retries.
type Ops struct {
	j   *journal.Journal
	log *slog.Logger

	mu       sync.Mutex
	inflight map[string]chan struct{} // operation id → closed when it finishes
}

// NewOps keeps operation records in j.
func NewOps(j *journal.Journal, log *slog.Logger) *Ops {
	return &Ops{j: j, log: log, inflight: map[string]chan struct{}{}}
}

// Begin looks up an operation id. If the operation already finished it
// returns its record (done or failed) and started=false. If it is running
// in this process it waits for it. Otherwise it runs create inside the
// same transaction that records the operation as pending; End must be
// called once a started operation finished.
func (o *Ops) Begin(ctx context.Context, op journal.Operation, create func(*journal.Tx) error) (_ journal.Operation, started bool, _ error) {
	for {
		o.mu.Lock()
		wait, running := o.inflight[op.ID]
		o.mu.Unlock()
		if running {
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return op, false, errdefs.Errorf(errdefs.CodeUnavailable, "operation %q still running: %v", op.ID, ctx.Err())
			}
		}
		var prev journal.Operation
		var found bool
		err := o.j.Update(func(tx *journal.Tx) error {
			var err error
			if prev, found, err = tx.Operation(op.ID); err != nil || found {
				return err
			}
			if err := create(tx); err != nil {
				return err
			}
			return tx.PutOperation(op)
		})
		if err != nil {
			return op, false, TxErr("journal operation "+op.ID, err)
		}
		if found {
			if prev.RequestHash != op.RequestHash {
				return prev, false, errdefs.Errorf(errdefs.CodeConflict, "operation_id %q was used for a different request", op.ID)
			}
			if prev.State == journal.OpPending {
				// Pending but not running here: a takeover's reconciler
				// resolves these before serving, so this is a bug or a race
				// with reconcile; never run it twice.
				return prev, false, errdefs.Errorf(errdefs.CodeUnavailable, "operation %q is pending recovery", op.ID)
			}
			return prev, false, nil
		}
		o.mu.Lock()
		o.inflight[op.ID] = make(chan struct{})
		o.mu.Unlock()
		return op, true, nil
	}
}

// End marks a started operation finished in this process.
func (o *Ops) End(id string) {
	o.mu.Lock()
	if ch, ok := o.inflight[id]; ok {
		close(ch)
		delete(o.inflight, id)
	}
	o.mu.Unlock()
}

// Fail stores the operation's error so a retry gets the same answer, and
// returns that answer.
func (o *Ops) Fail(op journal.Operation, cause error) error {
	code := errdefs.CodeOf(cause)
	msg := cause.Error()
	var ae *errdefs.Error
	if errors.As(cause, &ae) {
		msg = ae.Message
	}
	op.State, op.Error = journal.OpFailed, &journal.OpError{Code: code, Message: msg}
	if err := o.j.Update(func(tx *journal.Tx) error { return tx.PutOperation(op) }); err != nil {
		o.log.Error("journal failed operation", "op", op.ID, "err", err)
	}
	return &errdefs.Error{Code: code, Message: msg}
}

// Outcome is a finished operation's stored answer (the wire bytes its
// first run returned) or its error.
func Outcome(op journal.Operation) (json.RawMessage, error) {
	if op.Error != nil {
		return nil, &errdefs.Error{Code: op.Error.Code, Message: op.Error.Message}
	}
	if len(op.Result) == 0 {
		return nil, errdefs.Errorf(errdefs.CodeInternal, "operation %s finished without a stored answer", op.ID)
	}
	return op.Result, nil
}

// TxErr is a journal transaction's failure as its caller returns it: a
// refusal the transaction decided (an *errdefs.Error) as it is, anything
// else (the journal failed or was fenced) wrapped with what was being
// journaled. Its kind is read at the edge (errdefs.CodeOf).
func TxErr(what string, err error) error {
	var refused *errdefs.Error
	if errors.As(err, &refused) {
		return refused
	}
	return fmt.Errorf("%s: %w", what, err)
}

// Stored is the answer journaled with the finished operation id: a repeat
// of the operation gets exactly these bytes.
func Stored(j *journal.Journal, id string) (json.RawMessage, error) {
	var o journal.Operation
	var ok bool
	if err := j.View(func(tx *journal.Tx) (err error) {
		o, ok, err = tx.Operation(id)
		return err
	}); err != nil || !ok || o.State != journal.OpDone {
		return nil, errdefs.Errorf(errdefs.CodeInternal, "answer of operation %s not journaled (found %v, state %q): %v", id, ok, o.State, err)
	}
	return Outcome(o)
}

// Sandbox is sandbox id's record (not_found: the journal never saw it).
func Sandbox(j *journal.Journal, id string) (journal.Sandbox, error) {
	var s journal.Sandbox
	var ok bool
	err := j.View(func(tx *journal.Tx) (err error) {
		s, ok, err = tx.Sandbox(id)
		return err
	})
	if err != nil {
		return s, errdefs.Errorf(errdefs.CodeInternal, "read journal: %v", err)
	}
	if !ok {
		return s, errdefs.Errorf(errdefs.CodeNotFound, "sandbox %q not found", id)
	}
	return s, nil
}

// Current is sandbox id's record in tx for a call (what: "release") on
// its generation gen (0: whichever is current): not_found when the
// journal never saw it, fenced when gen is not its current generation.
func Current(tx *journal.Tx, id string, gen uint64, what string) (journal.Sandbox, error) {
	s, ok, err := tx.Sandbox(id)
	if err != nil {
		return s, err
	}
	if !ok {
		return s, errdefs.Errorf(errdefs.CodeNotFound, "sandbox %q not found", id)
	}
	if gen != 0 && gen != s.Generation {
		return s, errdefs.Errorf(errdefs.CodeFenced, "%s of generation %d refused: current generation is %d", what, gen, s.Generation)
	}
	return s, nil
}
