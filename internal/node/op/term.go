// Package op runs the node's operations: the primary's term (no kernel
// effect after it), operation records (one run per operation id, the
// answer kept for retries), the journal-before-effect runner of a
// generation's entries, per-sandbox locks and the crash points tests kill
// the process at. It knows journal records and nothing of the node's
// concerns: the node and its concern packages drive it.
package op

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
)

// ErrTermOver means the primary's term ended: no kernel effect is made.
// Its kind is unavailable: the next primary answers.
var ErrTermOver error = termOver{}

type termOver struct{}

func (termOver) Error() string           { return "primary term over" }
func (termOver) ErrorCode() errdefs.Code { return errdefs.CodeUnavailable }

// Term is the primary's term. When it ends (SIGTERM, a lost lock, a fenced
// journal, failed health) every operation in flight is cancelled, makes no
// further kernel effect (rollbacks included: a half-done claim or release
// stays journaled for the next primary's reconcile) and is waited for
// (Drain) before the lock is given back.
type Term struct {
	ctx context.Context

	mu       sync.Mutex
	draining bool           // Drain started: no new operation
	ops      sync.WaitGroup // operations of the term in flight (Begin)
}

// NewTerm is the term that ends with ctx (nil: never ends, for tests).
func NewTerm(ctx context.Context) *Term {
	if ctx == nil {
		ctx = context.Background()
	}
	return &Term{ctx: ctx}
}

// Context ends with the term.
func (t *Term) Context() context.Context { return t.ctx }

// Live returns ErrTermOver once the term ended. Every kernel effect checks
// it right before it is made.
func (t *Term) Live() error {
	if err := t.ctx.Err(); err != nil {
		return fmt.Errorf("%w (%v): no kernel effect after the term; the next primary reconciles", ErrTermOver, err)
	}
	return nil
}

// Begin registers an operation of the term and returns its context, which
// ends with the request (ctx) or with the term, whichever comes first. done
// must be called when the operation (and any rollback) returns.
func (t *Term) Begin(ctx context.Context) (_ context.Context, done func(), _ error) {
	t.mu.Lock()
	if t.draining || t.ctx.Err() != nil {
		t.mu.Unlock()
		return ctx, func() {}, errdefs.Errorf(errdefs.CodeNotPrimary, "this primary's term is over; retry against the new primary")
	}
	t.ops.Add(1)
	t.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(t.ctx, cancel)
	return ctx, func() { stop(); cancel(); t.ops.Done() }, nil
}

// Background is the context of work that must not stop with the request
// that started it (a rollback, a release's teardown) but must stop with the
// term.
func (t *Term) Background(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(t.ctx, d)
}

// Drain refuses new operations, calls closing, and waits, up to timeout,
// for the operations in flight; the caller ends the term first so they
// stop. An error means work may still be running.
func (t *Term) Drain(timeout time.Duration, closing func()) error {
	t.mu.Lock()
	t.draining = true
	t.mu.Unlock()
	closing()
	done := make(chan struct{})
	go func() { t.ops.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("operations still running %v after the term ended", timeout)
	}
}

// EveryTick runs fn every d until ctx ends or stopped says so.
func EveryTick(ctx context.Context, d time.Duration, stopped func() bool, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if stopped() {
			return
		}
		fn()
	}
}
