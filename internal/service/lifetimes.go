package service

import (
	"context"
	"time"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/manager"
)

// Lifetimes: a sandbox's timeout is a timer row in the store. The loop
// reads the due ones; firing one is (1) mark it firing in the store, (2)
// destroy the sandbox through the manager, whose release is recorded
// with its operation id before it is sent, (3) mark the timer done with
// that operation, ending the sandbox's reservation. A server that dies
// anywhere in between finds the timer still firing when it starts again
// and repeats (2), which reuses the pending release's operation id (the
// node answers it idempotently) or finds the sandbox already released:
// the release happens once.

const timersPerTick = 32

func (s *Server) runTimers(ctx context.Context) {
	t := time.NewTicker(orDefault(s.TimerInterval, DefaultTimerInterval))
	defer t.Stop()
	var pruned time.Time
	for {
		s.fireDue(ctx)
		s.fireIdleDue(ctx)
		s.watchExits(ctx)
		if now := s.now(); now.Sub(pruned) >= time.Minute {
			pruned = now
			if n, err := s.Store.PruneIdempotent(ctx, now.Add(-orDefault(s.IdempotencyTTL, DefaultIdempotencyTTL))); err != nil && ctx.Err() == nil {
				s.log().Error("prune idempotency keys", "err", err)
			} else if n > 0 {
				s.log().Info("forgot old idempotency keys", "count", n)
			}
			if _, err := s.Store.PruneEvents(ctx, now.Add(-orDefault(s.EventTTL, DefaultEventTTL))); err != nil && ctx.Err() == nil {
				s.log().Error("prune events", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Server) fireDue(ctx context.Context) {
	due, err := s.Store.DueTimers(ctx, s.now(), timersPerTick)
	if err != nil {
		if ctx.Err() == nil {
			s.log().Error("read due timers", "err", err)
		}
		return
	}
	for _, t := range due {
		if ctx.Err() != nil {
			return
		}
		if err := s.fire(ctx, t); err != nil {
			s.log().Warn("timeout not completed; retried at the next tick", "sandbox", t.SandboxID, "err", err)
		}
	}
}

func (s *Server) fire(ctx context.Context, t manager.Timer) error {
	// One replica fires it; one that dies firing leaves it to the others
	// once its lease expires.
	leaseID, ok := s.timerLease(ctx, leaseTimeout, t.Owner, t.SandboxID)
	if !ok {
		return nil
	}
	defer s.letGo(ctx, leaseID, true)
	_, ok, err := s.Store.MarkFiring(ctx, t.SandboxID)
	if err != nil || !ok {
		return err
	}
	log := s.log().With("sandbox", t.SandboxID, "owner", t.Owner)
	log.Info("timeout firing", "deadline", t.Deadline, "attempt", t.Attempts+1)
	if s.AfterMarkFiring != nil {
		if err := s.AfterMarkFiring(t.SandboxID); err != nil {
			return err
		}
	}
	res, err := s.Manager.Destroy(ctx, t.SandboxID)
	if err != nil {
		return err
	}
	if err := s.Store.FinishTimer(context.WithoutCancel(ctx), t.SandboxID, res.OperationID, res.Verdict.OK()); err != nil {
		return err
	}
	if !res.Verdict.OK() {
		log.Warn("timeout released the sandbox but its cleanup is unproven: its quota share stays taken", "reason", res.Verdict.Reason, "failed_checks", res.Verdict.FailedChecks)
	}
	s.emit(t.Owner, t.SandboxID, client.EventDestroyed, "timeout")
	log.Info("timeout fired: sandbox destroyed", "operation", res.OperationID, "proof_verified", res.Verdict.Verified, "proof_clean", res.Verdict.Clean, "already_released", res.AlreadyReleased)
	return nil
}

// failUnsettled fails the sandbox's pending claim in the manager's
// records (when it got that far) and ends the owner's sandbox with the
// reason, in one transaction: a reader never sees it failed without
// the reason (it once did, between two writes).
func (s *Server) failUnsettled(ctx context.Context, o manager.OwnedSandbox, reason string) error {
	return s.Store.FailCreate(ctx, o.ID, reason, reason)
}
