package node

import (
	"context"
	"strings"
	"time"

	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/op"
	"github.com/ctld/ctld/internal/proof"
)

// Defaults of the withheld retry: the first retry a minute after the
// unproven teardown, then doubling up to an hour between attempts, so a
// generation that stays unprovable costs one teardown and one /proc scan
// an hour.
const (
	DefaultWithheldRetry    = time.Minute
	DefaultWithheldRetryMax = time.Hour
)

// retryOp is the operation id the cleanup proofs of a withheld
// generation's retries are stored under (the latest attempt's proof).
func retryOp(cid string) string { return "retry-" + cid }

// retryDelay is the wait after the attempt-th retry: base doubling per
// attempt, capped at most.
func retryDelay(base, most time.Duration, attempt int) time.Duration {
	d := base
	for i := 1; i < attempt && d < most; i++ {
		d *= 2
	}
	return min(d, most)
}

// withheld lists the withheld generations (they stay in the live index
// until a clean proof ends them).
func (n *Node) withheld() ([]journal.Sandbox, error) {
	var out []journal.Sandbox
	err := n.d.Journal.View(func(tx *journal.Tx) error {
		ss, err := tx.LiveSandboxes()
		for _, s := range ss {
			if s.Withheld {
				out = append(out, s)
			}
		}
		return err
	})
	return out, err
}

// retryWithheld retries the teardown of the withheld generations that
// pick selects. Teardown is
// idempotent: it removes what is left, and a clean signed proof ends the
// generation and returns its capacity in the same transaction; an
// unclean one keeps it withheld until the next attempt.
func (n *Node) retryWithheld(ctx context.Context, trigger string, pick func(journal.Sandbox) bool) {
	ss, err := n.withheld()
	if err != nil {
		n.log.Error("list withheld generations", "err", err)
		return
	}
	for _, s := range ss {
		if ctx.Err() != nil {
			return
		}
		if !pick(s) {
			continue
		}
		n.retryOne(ctx, s, trigger)
	}
}

func (n *Node) retryOne(ctx context.Context, s journal.Sandbox, trigger string) {
	// An attempt is an operation of the term: it stops with the term and
	// the drain waits for it; the next primary retries on its takeover.
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return
	}
	defer done()
	attempt := s.RetryAttempts + 1
	log := n.log.With("sandbox", s.ID, "generation", s.Generation, "attempt", attempt, "trigger", trigger)
	log.Info("retrying teardown of withheld generation", "failed_before", s.Reason)
	base, _, _ := strings.Cut(s.Reason, "; cleanup unproven: ")
	p, terr := n.teardown(ctx, s, retryOp(s.ContainerID), s.State, base)
	if n.live() != nil {
		log.Warn("withheld retry stopped by the end of the term", "err", terr)
		return
	}
	now := time.Now().UTC()
	next := now.Add(retryDelay(n.cfg.WithheldRetry, n.cfg.WithheldRetryMax, attempt))
	err = n.d.Journal.Update(func(tx *journal.Tx) error {
		cur, ok, err := tx.Sandbox(s.ID)
		if err != nil || !ok || cur.Generation != s.Generation {
			return err
		}
		cur.RetryAttempts, cur.RetryLast, cur.RetryNext = attempt, now, time.Time{}
		if cur.Withheld {
			cur.RetryNext = next
		}
		return tx.PutSandbox(cur)
	})
	if err != nil {
		log.Error("journal withheld retry", "err", err)
	}
	if p.Clean {
		log.Info("withheld generation proven clean: capacity returned", "proof", p.OperationID, "err", terr)
		return
	}
	log.Warn("withheld generation still unproven", "err", terr, "next_attempt", next.Format(time.RFC3339))
}

// RetryWithheld retries withheld teardowns on a timer until ctx (the
// term) ends or the node closes: every WithheldRetry it retries the generations whose
// backoff has passed. Reconcile already retried all of them once on
// takeover. A zero WithheldRetry disables the timer.
func (n *Node) RetryWithheld(ctx context.Context) {
	if n.cfg.WithheldRetry <= 0 {
		return
	}
	n.everyTick(ctx, n.cfg.WithheldRetry, func() {
		now := time.Now()
		n.retryWithheld(ctx, "timer", func(s journal.Sandbox) bool { return !now.Before(s.RetryNext) })
	})
}

// everyTick runs fn every d until ctx (the term) ends or the node closes.
func (n *Node) everyTick(ctx context.Context, d time.Duration, fn func()) {
	op.EveryTick(ctx, d, n.isClosed, fn)
}

// isClosed says whether Close ran.
func (n *Node) isClosed() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.closed
}

// withheldIn picks the generations that were withheld in ss (the journal
// as a takeover found it), not those its own reconcile just withheld.
func withheldIn(ss []journal.Sandbox) func(journal.Sandbox) bool {
	was := map[string]bool{}
	for _, s := range ss {
		if s.Withheld {
			was[s.ContainerID] = true
		}
	}
	return func(s journal.Sandbox) bool { return was[s.ContainerID] }
}

// Withheld is a generation whose capacity is withheld: its cleanup is
// unproven. The node retries its teardown on takeover and on a timer
// with backoff; a clean proof (stored under ProofOperationID) returns the
// capacity.
type Withheld struct {
	SandboxID  string
	Generation uint64
	Reason     string
	Resources  Capacity
	// FailedChecks are the failed checks of the latest cleanup proof.
	FailedChecks             []proof.Check
	ProofOperationID         string
	RetryAttempts            int
	LastAttempt, NextAttempt time.Time
}

// withheldLease is a withheld generation as the node's info lists it,
// with the failed checks of its latest cleanup proof.
func withheldLease(tx *journal.Tx, s journal.Sandbox) Withheld {
	w := Withheld{
		SandboxID: s.ID, Generation: s.Generation, Reason: s.Reason, Resources: held(s),
		ProofOperationID: s.ProofOp, RetryAttempts: s.RetryAttempts, LastAttempt: s.RetryLast, NextAttempt: s.RetryNext,
		FailedChecks: []proof.Check{},
	}
	if s.ProofOp == "" {
		return w
	}
	if p, ok, err := tx.Proof(s.ProofOp); err == nil && ok {
		for _, c := range p.Checks {
			if !c.OK {
				w.FailedChecks = append(w.FailedChecks, c)
			}
		}
	}
	return w
}
