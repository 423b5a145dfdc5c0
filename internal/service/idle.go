package service

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"sync"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/manager"
)

// Idle timeouts (a create's idle_timeout_sec): every exec, file and log
// call touches the sandbox's idle timer in the store (before and after
// the call; the store throttles the writes); a due one fires like the
// timeout timer (marked firing, then the node is asked, then done), and
// pauses a block-mode sandbox (its files are kept) or destroys another.
// A call still running holds it off: the timer is touched instead.

// counter counts calls in flight by sandbox id.
type counter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counter) add(id string, d int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[id] += d
	if c.n[id] <= 0 {
		delete(c.n, id)
	}
}

func (c *counter) busy(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[id] > 0
}

// active wraps a handler of a sandbox's activity: its idle timer is
// touched when the call starts and ends (owner-scoped in the store: a
// caller cannot keep another owner's sandbox alive).
func (s *Server) active(h handlerFunc) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request, owner string) error {
		id := r.PathValue("id")
		s.touch(r.Context(), owner, id)
		s.inFlight.add(id, 1)
		defer func() {
			s.inFlight.add(id, -1)
			s.touch(context.WithoutCancel(r.Context()), owner, id)
		}()
		return h(w, r, owner)
	}
}

func (s *Server) touch(ctx context.Context, owner, id string) {
	if err := s.Store.TouchIdle(ctx, owner, id, s.now()); err != nil && ctx.Err() == nil {
		s.log().Warn("touch idle timer", "sandbox", id, "err", err)
	}
}

func (s *Server) fireIdleDue(ctx context.Context) {
	due, err := s.Store.DueIdle(ctx, s.now(), timersPerTick)
	if err != nil {
		if ctx.Err() == nil {
			s.log().Error("read due idle timers", "err", err)
		}
		return
	}
	for _, t := range due {
		if ctx.Err() != nil {
			return
		}
		if err := s.fireIdle(ctx, t); err != nil {
			s.log().Warn("idle timeout not completed; retried at the next tick", "sandbox", t.SandboxID, "err", err)
		}
	}
}

func (s *Server) fireIdle(ctx context.Context, t manager.IdleTimer) error {
	if t.State == "armed" && (s.inFlight.busy(t.SandboxID) || s.egressGrew(ctx, t)) {
		s.touch(ctx, t.Owner, t.SandboxID)
		return nil
	}
	leaseID, ok := s.timerLease(ctx, leaseIdle, t.Owner, t.SandboxID)
	if !ok {
		return nil
	}
	defer s.letGo(ctx, leaseID, true)
	_, ok, err := s.Store.MarkIdleFiring(ctx, t.SandboxID)
	if err != nil || !ok {
		return err
	}
	log := s.log().With("sandbox", t.SandboxID, "owner", t.Owner)
	o, err := s.Store.OwnedSandbox(ctx, t.Owner, t.SandboxID)
	if err != nil {
		return err
	}
	var rec record
	if err := json.Unmarshal(o.Spec, &rec); err != nil {
		return fmt.Errorf("decode the spec of %s: %w", o.ID, err)
	}
	log.Info("idle timeout firing", "idle", t.Idle, "attempt", t.Attempts+1)
	if rec.Spec.RootFS.Mode == api.RootFSBlock {
		return s.idlePause(ctx, log, t)
	}
	res, err := s.Manager.Destroy(ctx, t.SandboxID)
	if err != nil {
		return err
	}
	if err := s.Store.FinishIdle(context.WithoutCancel(ctx), t.SandboxID, "destroy", res.OperationID, res.Verdict.OK()); err != nil {
		return err
	}
	s.emit(t.Owner, t.SandboxID, client.EventDestroyed, "idle")
	log.Info("idle timeout fired: sandbox destroyed", "operation", res.OperationID, "proof_verified", res.Verdict.Verified, "proof_clean", res.Verdict.Clean)
	return nil
}

// idlePause pauses an idle block-mode sandbox. A repeat (the server
// stopped after the pause) finds it released and only records it.
func (s *Server) idlePause(ctx context.Context, log *slog.Logger, t manager.IdleTimer) error {
	var opID string
	sb, err := s.Manager.Store.Sandbox(ctx, t.SandboxID)
	if err != nil {
		return err
	}
	if sb.State != api.StateReleased {
		res, err := s.Manager.Pause(ctx, t.SandboxID)
		if err != nil {
			return err
		}
		opID = res.OperationID
	}
	if err := s.Store.FinishIdle(context.WithoutCancel(ctx), t.SandboxID, "pause", opID, false); err != nil {
		return err
	}
	s.emit(t.Owner, t.SandboxID, client.EventPaused, "idle")
	log.Info("idle timeout fired: sandbox paused", "operation", opID)
	return nil
}
