package node

import (
	"context"
	"time"

	"github.com/ctld/ctld/internal/node/op"
)

// The node acts only within its primary's term (Deps.Term, an op.Term):
// when it ends, operations in flight are cancelled, make no further
// kernel effect and are waited for (Drain) before the lock is given back.

// ErrTermOver means the primary's term ended: no kernel effect is made.
var ErrTermOver = op.ErrTermOver

// live returns ErrTermOver once the term ended. Every kernel effect checks
// it right before it is made.
func (n *Node) live() error { return n.term.Live() }

// begin registers an operation of the term (op.Term.Begin).
func (n *Node) begin(ctx context.Context) (context.Context, func(), error) { return n.term.Begin(ctx) }

// background is the context of work that must not stop with the request
// that started it (a rollback, a release's teardown) but must stop with the
// term.
func (n *Node) background(d time.Duration) (context.Context, context.CancelFunc) {
	return n.term.Background(d)
}

// Drain refuses new operations and waits, up to timeout, for those in
// flight; the caller ends the term (cancels Deps.Term) first so they stop.
// Only after Drain returns nil may the journal be closed and the lock
// released: an error means work may still be running, and the process must
// exit while it still holds the lock (the kernel then drops it).
func (n *Node) Drain(timeout time.Duration) error { return n.term.Drain(timeout, n.Close) }

// txErr is op.TxErr: a transaction's refusal as it is, a journal failure
// wrapped.
func txErr(what string, err error) error { return op.TxErr(what, err) }
