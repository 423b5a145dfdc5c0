package node

import (
	"context"
	"errors"
	"io/fs"
	"path/filepath"
	"sync"
	"time"

	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/exitwatch"
)

// exitWatch is the primary's watch over its ready generations (issue 22
// §1): the moment a guest ends, its exit is journaled (state exited, how
// and when: Sandbox.Exit) and, for a claim with on_exit release, the
// generation is released with a cleanup proof. It lives for the term:
// Reconcile re-arms it on takeover, and journals the exits that happened
// while no primary watched.
type exitWatch struct {
	once   sync.Once
	w      *exitwatch.Watcher
	cancel context.CancelFunc
}

// exitOp is the operation id of the release on_exit release makes: derived
// from the container, so the release a new primary re-arms is the same
// operation, never a second one.
func exitOp(cid string) string { return "exit-" + cid }

// exitWatcher starts the watch on first use, for the term (nil: the
// watch is off, Config.ExitPoll < 0).
func (n *Node) exitWatcher() *exitwatch.Watcher {
	e := &n.exits
	e.once.Do(func() {
		if n.cfg.ExitPoll < 0 {
			return
		}
		ctx, cancel := context.WithCancel(n.term.Context())
		e.w, e.cancel = exitwatch.New(n.cfg.ExitPoll, n.log), cancel
		go e.w.Run(ctx)
	})
	return e.w
}

// stopExitWatch ends the watch (Close): the next primary re-arms it.
func (n *Node) stopExitWatch() {
	e := &n.exits
	e.once.Do(func() {}) // never start after Close
	if e.cancel != nil {
		e.cancel()
	}
}

// watchExit arms the exit watch of ready generation s: woken by a change
// of its lease's cgroup.events or of its agent's socket dir (the exit
// report is renamed into it as the workload ends, before the runtime's
// own teardown, which takes seconds under emulation).
func (n *Node) watchExit(ctx context.Context, s journal.Sandbox) {
	if s.LeaseID == "" || n.live() != nil {
		return
	}
	id, gen, cid := s.ID, s.Generation, s.ContainerID
	paths := []string{n.guest.AgentSockDir(cid)}
	if dir := n.d.Guest.Leases.Dir(s.LeaseID); dir != "" {
		paths = append(paths, filepath.Join(dir, "cgroup.events"))
	}
	if w := n.exitWatcher(); w != nil {
		w.Watch(ctx, cid, paths, n.guestEnded(s), func() { n.guestGone(id, gen, cid) })
	}
}

// guestEnded says whether the guest of generation s ended: its lease has
// no process left (cgroup.events populated 0, the kernel's word). The
// agent's exit report alone is no end: it lies in the agent socket dir,
// which the guest's root can write, so a workload could leave one and run
// on unmetered; the report only wakes the watch (the runtime's teardown
// follows it) and gives the code once the lease is empty.
func (n *Node) guestEnded(s journal.Sandbox) exitwatch.Ended {
	leaseID := s.LeaseID
	return func(ctx context.Context) (bool, error) {
		pop, err := n.d.Guest.Leases.Populated(ctx, leaseID)
		return err == nil && !pop, err
	}
}

// guestGone journals the end of generation gen of sandbox id, whose lease
// has no process left, if it is still ready (a release or pause ends its
// guest after leaving ready: that is no exit), then acts on its on_exit.
func (n *Node) guestGone(id string, gen uint64, cid string) {
	if n.live() != nil {
		return // the next primary's reconcile journals it
	}
	ctx, cancel := n.background(time.Minute)
	defer cancel()
	if s, ok := n.recordExit(ctx, id, gen, cid, false); ok {
		n.onExit(s)
	}
}

// exitedUnwatched journals the exit of ready generation s if its guest
// ended while no primary watched (Reconcile, before the kernel check
// that would call it lost); ok says it did. Only an empty lease whose end
// the guest explains (its agent's report) or the lease does (an OOM
// kill) counts: a guest that vanished without either, unseen, is lost as
// before.
func (n *Node) exitedUnwatched(ctx context.Context, s journal.Sandbox) (journal.Sandbox, bool) {
	if s.State != journal.StateReady || s.LeaseID == "" {
		return s, false
	}
	if ended, err := n.guestEnded(s)(ctx); err != nil || !ended {
		return s, false
	}
	return n.recordExit(ctx, s.ID, s.Generation, s.ContainerID, true)
}

// recordExit reads how the guest of generation gen ended and journals it
// (state exited) if the generation is still ready; ok says it did. A lease
// that is gone altogether is no exit: the generation is lost (Reconcile);
// so is a crash when explained is set.
func (n *Node) recordExit(ctx context.Context, id string, gen uint64, cid string, explained bool) (journal.Sandbox, bool) {
	log := n.log.With("sandbox", id, "generation", gen, "container", cid)
	// A pause holds the sandbox's lock from its seal until the generation
	// is releasing (or the seal abandoned), a release until it left ready:
	// the exit is judged after them, never journaled under a seal that
	// then overwrites it.
	unlock := n.lockSandbox(id)
	defer unlock()
	cur, err := n.sandbox(id)
	if err != nil || cur.Generation != gen || cur.ContainerID != cid || cur.State != journal.StateReady {
		return journal.Sandbox{}, false
	}
	var f exitwatch.Facts
	f.Report, f.ReportFound, f.ReportErr = exitwatch.ReadReport(n.guest.AgentSockDir(cid))
	st, err := n.d.Guest.Leases.Stats(ctx, cur.LeaseID)
	if errors.Is(err, fs.ErrNotExist) {
		return journal.Sandbox{}, false
	}
	f.OOMKills, f.OOMErr = st.OOMKills, err
	e := exitwatch.Classify(f)
	if explained && e.Kind == journal.ExitCrash {
		return journal.Sandbox{}, false
	}
	e.At, e.SeenBy = time.Now().UTC(), n.d.Epoch
	var out journal.Sandbox
	ok := false
	err = n.d.Journal.Update(func(tx *journal.Tx) error {
		s, found, err := tx.Sandbox(id)
		if err != nil || !found || s.Generation != gen || s.ContainerID != cid || s.State != journal.StateReady {
			return err
		}
		s.State, s.Exit, s.Reason = journal.StateExited, &e, exitwatch.Reason(e)
		s.OOMKills = max(s.OOMKills, e.OOMKills)
		out, ok = s, true
		return tx.PutSandbox(s)
	})
	if err != nil {
		log.Error("journal the guest's exit", "err", err)
		return journal.Sandbox{}, false
	}
	if ok {
		log.Info("guest exited", "kind", e.Kind, "code", e.Code, "oom_kills", e.OOMKills, "detail", e.Detail)
	}
	return out, ok
}

// onExit releases exited generation s if its claim asked (on_exit
// release), in the background: with the cleanup proof, capacity back,
// the exit kept in the record.
func (n *Node) onExit(s journal.Sandbox) {
	if s.State != journal.StateExited || s.Request == nil || s.Request.OnExit != journal.OnExitRelease {
		return
	}
	id, gen, cid := s.ID, s.Generation, s.ContainerID
	go n.releaseInBackground(id, gen, exitOp(cid), "on exit")
}
