package service

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/manager"
)

// on_exit (issue 23): a sandbox whose workload's main process exits is
// seen by its node at once (ctld's exit watch journals state exited with
// the exit status). Each timer tick the service asks the node about the
// active sandboxes it has ready; an exit is recorded once in the store
// (the sandbox's exit, its generation exited) with an "exited" event;
// on_exit destroy then destroys it like DELETE does: a release with its
// cleanup proof, the owner's quota back only on a verified clean proof.
// The record is the store's, so a restart or another replica neither
// forgets the exit nor sends its event twice; a destroy that did not
// finish is retried at the next tick (the manager reuses its pending
// release's operation id).

// exitsPage bounds one store read of the sandboxes to watch.
const exitsPage = 200

// watchExits looks at one page of the sandboxes to watch, after the last
// one the previous tick looked at (exitsAfter): every sandbox is looked
// at within a few ticks however many there are.
func (s *Server) watchExits(ctx context.Context) {
	page := s.exitsPage
	if page <= 0 {
		page = exitsPage
	}
	cands, err := s.Store.ExitCandidates(ctx, s.exitsAfter, page)
	if err != nil {
		if ctx.Err() == nil {
			s.log().Error("read sandboxes to watch for exits", "err", err)
		}
		return
	}
	s.exitsAfter = ""
	if len(cands) == page {
		s.exitsAfter = cands[len(cands)-1].ID
	}
	for _, o := range cands {
		if ctx.Err() != nil {
			return
		}
		var rec record
		_ = json.Unmarshal(o.Spec, &rec)
		if o.Exit == nil {
			e, ok := s.nodeExit(ctx, o)
			if !ok {
				continue
			}
			first, err := s.Store.RecordExit(ctx, o.ID, o.Generation, e, rec.OnExit == client.OnExitDestroy)
			if err != nil {
				s.log().Error("record a sandbox's exit", "sandbox", o.ID, "err", err)
				continue
			}
			if first {
				s.log().Info("sandbox exited", "sandbox", o.ID, "owner", o.Owner, "kind", e.Kind, "code", e.Code, "on_exit", rec.OnExit)
				s.emit(o.Owner, o.ID, client.EventExited, exitReason(e))
			}
			o.Exit = &e
		}
		if rec.OnExit == client.OnExitDestroy {
			s.destroyOnExitInBackground(ctx, o)
		}
	}
}

// DefaultMaxExitDestroys is Server.MaxExitDestroys's default.
const DefaultMaxExitDestroys = 8

// exitDestroys are the on_exit destroys running (destroyOnExitInBackground).
type exitDestroys struct {
	mu      sync.Mutex
	running map[string]bool // by sandbox id
}

// destroyOnExitInBackground runs destroyOnExit for o off the timer loop
// (a slow node must not hold every other timer back): one per sandbox at
// a time, at most MaxExitDestroys at once, and Serve waits for them. A
// sandbox whose destroy is running, or one over the cap, is left to a
// later tick (it stays a candidate until it is destroyed).
func (s *Server) destroyOnExitInBackground(ctx context.Context, o manager.OwnedSandbox) {
	d := &s.exitDestroys
	d.mu.Lock()
	if d.running == nil {
		d.running = map[string]bool{}
	}
	if d.running[o.ID] || len(d.running) >= int(orDefault(int64(s.MaxExitDestroys), DefaultMaxExitDestroys)) {
		d.mu.Unlock()
		return
	}
	d.running[o.ID] = true
	d.mu.Unlock()
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		defer func() {
			d.mu.Lock()
			delete(d.running, o.ID)
			d.mu.Unlock()
		}()
		s.destroyOnExit(ctx, o)
	}()
}

// nodeExit asks the node whether o's generation exited.
func (s *Server) nodeExit(ctx context.Context, o manager.OwnedSandbox) (manager.SandboxExit, bool) {
	nsb, err := s.Manager.NodeSandbox(ctx, o.ID)
	if err != nil || nsb.Generation != o.Generation || nsb.Exit == nil || nsb.State != api.StateExited {
		return manager.SandboxExit{}, false
	}
	return manager.SandboxExit{Kind: nsb.Exit.Kind, Code: nsb.Exit.Code, At: nsb.Exit.At.UTC()}, true
}

// destroyOnExit destroys exited sandbox o (on_exit destroy), once across
// replicas (the destroy lease, which a caller's DELETE takes too).
func (s *Server) destroyOnExit(ctx context.Context, o manager.OwnedSandbox) {
	leaseID, ok := s.timerLease(ctx, leaseDestroy, o.Owner, o.ID)
	if !ok {
		return
	}
	settled := false
	defer func() { s.letGo(ctx, leaseID, settled) }()
	log := s.log().With("sandbox", o.ID, "owner", o.Owner)
	res, err := s.Manager.Destroy(ctx, o.ID)
	if err != nil {
		log.Warn("destroy on exit not completed; retried at the next tick", "err", err)
		return
	}
	settled = true
	if !res.Verdict.OK() {
		log.Warn("destroyed on exit but its cleanup is unproven: its quota share stays taken", "reason", res.Verdict.Reason, "failed_checks", res.Verdict.FailedChecks)
		return
	}
	if err := s.Store.EndOwnedSandbox(context.WithoutCancel(ctx), o.ID, exitReason(*o.Exit)); err != nil {
		log.Error("end a sandbox destroyed on exit", "err", err)
		return
	}
	s.emit(o.Owner, o.ID, client.EventDestroyed, "on_exit")
	log.Info("destroyed on exit", "operation", res.OperationID, "proof_verified", res.Verdict.Verified, "proof_clean", res.Verdict.Clean)
}

// exitReason is an exit as an event's (and an ended sandbox's) reason.
func exitReason(e manager.SandboxExit) string {
	switch e.Kind {
	case api.ExitNormal:
		return fmt.Sprintf("exited: code %d", e.Code)
	case api.ExitOOM:
		return "exited: killed at its memory limit"
	default:
		return "exited: its runtime crashed"
	}
}

// viewExit is the wire form of a sandbox's recorded exit.
func viewExit(e *manager.SandboxExit) *client.ExitStatus {
	if e == nil {
		return nil
	}
	return &client.ExitStatus{Kind: e.Kind, Code: e.Code, At: e.At.UTC()}
}
