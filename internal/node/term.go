package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
)

// The node acts only within its primary's term (Deps.Term). When the term
// ends (SIGTERM, a lost lock, a fenced journal, failed health) every
// operation in flight is cancelled, makes no further kernel effect (rollbacks
// included: a half-done claim or release stays journaled for the next
// primary's reconcile) and is waited for (Drain) before the lock is given
// back.

// ErrTermOver means the primary's term ended: no kernel effect is made.
// Its kind is unavailable: the next primary answers.
var ErrTermOver error = termOver{}

type termOver struct{}

func (termOver) Error() string           { return "primary term over" }
func (termOver) ErrorCode() errdefs.Code { return errdefs.CodeUnavailable }

func (n *Node) termCtx() context.Context {
	if n.d.Term == nil {
		return context.Background()
	}
	return n.d.Term
}

// live returns ErrTermOver once the term ended. Every kernel effect checks
// it right before it is made.
func (n *Node) live() error {
	if err := n.termCtx().Err(); err != nil {
		return fmt.Errorf("%w (%v): no kernel effect after the term; the next primary reconciles", ErrTermOver, err)
	}
	return nil
}

// begin registers an operation of the term and returns its context, which
// ends with the request (ctx) or with the term, whichever comes first. done
// must be called when the operation (and any rollback) returns.
func (n *Node) begin(ctx context.Context) (context.Context, func(), error) {
	n.mu.Lock()
	if n.draining || n.termCtx().Err() != nil {
		n.mu.Unlock()
		return ctx, func() {}, errdefs.Errorf(errdefs.CodeNotPrimary, "this primary's term is over; retry against the new primary")
	}
	n.ops.Add(1)
	n.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(n.termCtx(), cancel)
	return ctx, func() { stop(); cancel(); n.ops.Done() }, nil
}

// background is the context of work that must not stop with the request
// that started it (a rollback, a release's teardown) but must stop with the
// term.
func (n *Node) background(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(n.termCtx(), d)
}

// Drain refuses new operations and waits, up to timeout, for those in
// flight; the caller ends the term (cancels Deps.Term) first so they stop.
// Only after Drain returns nil may the journal be closed and the lock
// released: an error means work may still be running, and the process must
// exit while it still holds the lock (the kernel then drops it).
func (n *Node) Drain(timeout time.Duration) error {
	n.mu.Lock()
	n.draining = true
	n.mu.Unlock()
	n.Close()
	done := make(chan struct{})
	go func() { n.ops.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("operations still running %v after the term ended", timeout)
	}
}

// txErr is a journal transaction's failure as its caller returns it: a
// refusal the transaction decided (an *errdefs.Error) as it is, anything
// else (the journal failed or was fenced) wrapped with what was being
// journaled. Its kind is read at the edge (errdefs.CodeOf).
func txErr(what string, err error) error {
	var refused *errdefs.Error
	if errors.As(err, &refused) {
		return refused
	}
	return fmt.Errorf("%s: %w", what, err)
}
