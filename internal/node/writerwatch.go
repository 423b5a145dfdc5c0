package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/writer"
)

// A generation's writer (its block root's, or a persistent volume's)
// that dies (kill -9, OOM, a crash) leaves its /dev/nbdX configured: the
// kernel holds the guest's I/O for the dead-connection timeout, waiting
// for a fresh socket. The primary
// notices the death (WatchWriters, or Reconcile on takeover) and starts
// the next writer on the same dir and device with a new writer epoch,
// journaled before it starts; that writer re-attaches the device
// (writer.Spec.Reattach), so the guest sees a pause, no I/O error, and
// finds every write a flush acknowledged. The dead writer's epoch is
// older than the journal's, so it is never taken for the current one. If
// RestartAttempts restarts fail (or the dead-connection timeout passed),
// the generation is lost and torn down with a cleanup proof, the reason
// naming the last failure.

// Defaults of the writers' watch.
const (
	DefaultWriterCheck    = time.Second
	DefaultWriterRestarts = 3
)

// WatchWriters checks the writers of every ready generation every
// CheckEvery, and restarts the dead ones, until ctx (the term) ends or
// the node closes.
func (n *Node) WatchWriters(ctx context.Context) {
	if n.d.Block == nil {
		return
	}
	every := n.cfg.Block.CheckEvery
	if every <= 0 {
		every = DefaultWriterCheck
	}
	n.everyTick(ctx, every, func() { n.checkWriters(ctx) })
}

// aWriter is one writer of a generation as journaled: its root's
// (Volume "") or a persistent volume's (Volume its id). The watch, the
// takeover and a volume's detach restart either the same way.
type aWriter struct {
	Volume   string
	Epoch    uint64
	Dir      string
	Index    int
	PID      int
	Restarts int
}

// what names w in logs and errors.
func (w aWriter) what() string {
	if w.Volume == "" {
		return "writer"
	}
	return "volume writer " + w.Volume
}

// writerOf is s's journaled writer of volume vol ("": the root's); ok is
// false when s journals none.
func (n *Node) writerOf(s journal.Sandbox, vol string) (aWriter, bool) {
	if vol == "" {
		if s.Block == nil {
			return aWriter{Dir: n.writerDir(s), Index: -1}, false
		}
		b := s.Block
		return aWriter{Epoch: b.WriterEpoch, Dir: n.writerDir(s), Index: b.Index, PID: b.PID, Restarts: b.Restarts}, true
	}
	i := slices.IndexFunc(s.Volumes, func(v journal.AttachedVolume) bool { return v.ID == vol })
	if i < 0 {
		return aWriter{Volume: vol, Index: -1}, false
	}
	v := s.Volumes[i]
	return aWriter{Volume: vol, Epoch: v.WriterEpoch, Dir: v.Dir, Index: v.Index, PID: v.PID, Restarts: v.Restarts}, true
}

// writersOf are the writers of ready generation s the watch keeps
// running: the root's (block mode) and each attached volume's.
func (n *Node) writersOf(s journal.Sandbox) []string {
	var out []string
	if rootfsMode(s) == journal.RootFSBlock {
		out = append(out, "")
	}
	for _, v := range s.Volumes {
		if v.Published == nil && v.PublishError == "" {
			out = append(out, v.ID)
		}
	}
	return out
}

// putWriter journals *w on s's record and returns s with it; also runs
// first in the same transaction and may change *w (the epoch).
func (n *Node) putWriter(s journal.Sandbox, w *aWriter, also func(*journal.Tx) error) (journal.Sandbox, error) {
	if w.Volume == "" {
		if s.Block == nil {
			return s, errors.New("no writer journaled")
		}
		b := *s.Block
		err := n.putBlock(s, &b, func(tx *journal.Tx) error {
			if also != nil {
				if err := also(tx); err != nil {
					return err
				}
			}
			b.WriterEpoch, b.PID, b.Restarts = w.Epoch, w.PID, w.Restarts
			return nil
		})
		if err != nil {
			return s, err
		}
		s.Block = &b
		return s, nil
	}
	i := slices.IndexFunc(s.Volumes, func(v journal.AttachedVolume) bool { return v.ID == w.Volume })
	if i < 0 {
		return s, fmt.Errorf("no attach of volume %s journaled", w.Volume)
	}
	av := s.Volumes[i]
	err := n.putVolume(s, &av, func(tx *journal.Tx) error {
		if also != nil {
			if err := also(tx); err != nil {
				return err
			}
		}
		av.WriterEpoch, av.PID, av.Restarts = w.Epoch, w.PID, w.Restarts
		return nil
	})
	if err != nil {
		return s, err
	}
	setVolume(&s, av)
	return s, nil
}

// writerSpec is the spec of w's next writer (a re-attach of its device):
// the root's over its journaled base, a volume's over the head its attach
// started from (a volume is sealed only at its detach).
func (n *Node) writerSpec(ctx context.Context, s journal.Sandbox, w aWriter) (writer.Spec, error) {
	spec := writer.Spec{
		Sandbox: s.ID, Generation: s.Generation, Epoch: w.Epoch,
		StoreDir: n.cfg.Block.StoreDir, Store: n.cfg.Block.Store, NodeKeyFile: n.cfg.Block.NodeKeyFile, NodeKeyID: n.cfg.Block.NodeKeyID, BaseCache: n.cfg.Block.BaseCache,
		Dir: w.Dir, Index: w.Index, Reattach: true,
		DeadConnTimeout: n.cfg.Block.DeadConnTimeout, RequestTimeout: n.cfg.Block.RequestTimeout,
	}
	if w.Volume == "" {
		base, err := n.baseOf(ctx, *s.Block)
		if err != nil {
			return spec, err
		}
		spec.Base = base
		return spec, nil
	}
	i := slices.IndexFunc(s.Volumes, func(v journal.AttachedVolume) bool { return v.ID == w.Volume })
	if i < 0 {
		return spec, fmt.Errorf("no attach of volume %s journaled", w.Volume)
	}
	vol := blockstore.Vol(w.Volume)
	spec.Volume, spec.Base = vol, blockstore.GenRef{Volume: vol, Generation: s.Volumes[i].Head.Generation}
	return spec, nil
}

// checkWriters checks the writers of each ready generation once.
func (n *Node) checkWriters(ctx context.Context) {
	var ss []journal.Sandbox
	err := n.d.Journal.View(func(tx *journal.Tx) error {
		all, err := tx.LiveSandboxes()
		for _, s := range all {
			if s.State == journal.StateReady && len(n.writersOf(s)) > 0 {
				ss = append(ss, s)
			}
		}
		return err
	})
	if err != nil {
		n.log.Error("writers' watch: read journal", "err", err)
		return
	}
	for _, s := range ss {
		for _, vol := range n.writersOf(s) {
			if ctx.Err() != nil {
				return
			}
			switch err := n.writerRuns(ctx, s, vol); {
			case err == nil:
			case errors.Is(err, writer.ErrNotRunning):
				n.writerDied(ctx, s.ID, s.Generation, vol, err)
			default:
				// Not known dead (e.g. /proc unreadable): a restart would find
				// a live writer and fail, and the generation would be lost.
				n.log.Warn("writers' watch: check writer", "sandbox", s.ID, "generation", s.Generation, "volume", vol, "err", err)
			}
		}
	}
}

// writerRuns is nil when s's writer of volume vol ("": the root's) runs
// with its journaled epoch. A pid the journal does not know yet (a
// restart the last primary did not get to journal) is journaled.
func (n *Node) writerRuns(ctx context.Context, s journal.Sandbox, vol string) error {
	w, ok := n.writerOf(s, vol)
	if !ok {
		return fmt.Errorf("%w: no %s journaled", writer.ErrNotRunning, w.what())
	}
	st, err := n.d.Block.Check(ctx, w.Dir)
	if err != nil {
		return err
	}
	if st.Epoch != w.Epoch {
		return fmt.Errorf("%w: the dir's %s is of epoch %d, the journal's %d", writer.ErrNotRunning, w.what(), st.Epoch, w.Epoch)
	}
	if st.PID != w.PID && st.Index == w.Index {
		w.PID = st.PID
		if _, err := n.putWriter(s, &w, nil); err != nil {
			n.log.Warn("journal the writer's pid", "sandbox", s.ID, "generation", s.Generation, "volume", vol, "err", err)
		}
	}
	return nil
}

// deadWriters are the writers of ready generation s that a takeover
// finds not running with their journaled epochs (Node.missing's test).
func (n *Node) deadWriters(ctx context.Context, s journal.Sandbox) []string {
	var dead []string
	for _, vol := range n.writersOf(s) {
		if n.writerRuns(ctx, s, vol) != nil {
			dead = append(dead, vol)
		}
	}
	return dead
}

// writerDied restarts the writer of volume vol ("": the root's) of
// generation gen of sandbox id, which the watch found dead (cause), or,
// if that fails, ends the generation as lost. It is an operation of the
// term and holds the sandbox's lock, so a release waits for it and then
// finds the generation as it left it.
func (n *Node) writerDied(ctx context.Context, id string, gen uint64, vol string, cause error) {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return
	}
	defer done()
	unlock := n.lockSandbox(id)
	defer unlock()
	s, err := n.sandbox(id)
	if err != nil || s.Generation != gen || s.State != journal.StateReady {
		return // released or replaced meanwhile
	}
	if err := n.writerRuns(ctx, s, vol); !errors.Is(err, writer.ErrNotRunning) {
		return
	}
	if _, err := n.restartWriter(ctx, s, vol, cause); err != nil {
		if n.live() != nil {
			return // the next primary's reconcile decides
		}
		n.loseWriter(ctx, s, err)
	}
}

// restartWriter starts the next writer of volume vol ("": the root's) of
// s on its dir and device (see the top of this file): up to
// RestartAttempts times, each with a new writer epoch journaled before
// the start. It returns s as journaled with the new writer.
func (n *Node) restartWriter(ctx context.Context, s journal.Sandbox, vol string, cause error) (journal.Sandbox, error) {
	w, ok := n.writerOf(s, vol)
	if !ok || w.Index < 0 {
		return s, fmt.Errorf("no device journaled for the dead %s: nothing to re-attach", w.what())
	}
	attempts := n.cfg.Block.RestartAttempts
	if attempts <= 0 {
		attempts = DefaultWriterRestarts
	}
	start := time.Now()
	log := n.log.With("sandbox", s.ID, "generation", s.Generation, "volume", vol, "device", "/dev/nbd"+strconv.Itoa(w.Index))
	log.Warn(w.what()+" died; restarting it on the same device", "old_epoch", w.Epoch, "old_pid", w.PID, "cause", cause)
	var errs []error
	for attempt := 1; attempt <= attempts; attempt++ {
		if attempt > 1 {
			// The guest's I/O fails once the dead-connection timeout
			// passed: restarting after that saves nothing.
			if d := n.cfg.Block.DeadConnTimeout; d > 0 && time.Since(start) >= d {
				errs = append(errs, fmt.Errorf("the dead-connection timeout (%v) passed", d))
				break
			}
			select {
			case <-ctx.Done():
				return s, errors.Join(append(errs, ctx.Err())...)
			case <-time.After(time.Duration(attempt-1) * time.Second):
			}
		}
		if err := n.live(); err != nil {
			return s, err
		}
		rs, err := n.startNextWriter(ctx, s, vol)
		if err == nil {
			nw, _ := n.writerOf(rs, vol)
			log.Info(w.what()+" restarted", "epoch", nw.Epoch, "pid", nw.PID, "attempt", attempt,
				"restarts", nw.Restarts, "after_ms", time.Since(start).Milliseconds())
			return rs, nil
		}
		log.Warn(w.what()+" restart failed", "attempt", attempt, "of", attempts, "err", err)
		errs = append(errs, fmt.Errorf("attempt %d: %w", attempt, err))
		s = rs
	}
	return s, fmt.Errorf("%s died (%v) and was not restarted: %w", w.what(), cause, errors.Join(errs...))
}

// startNextWriter journals the next writer epoch on s's record of
// volume vol's writer ("": the root's) and starts a writer of that epoch
// that re-attaches its device.
func (n *Node) startNextWriter(ctx context.Context, s journal.Sandbox, vol string) (journal.Sandbox, error) {
	w, ok := n.writerOf(s, vol)
	if !ok {
		return s, fmt.Errorf("no %s journaled", w.what())
	}
	s, err := n.putWriter(s, &w, func(tx *journal.Tx) (err error) {
		w.Restarts++
		w.Epoch, err = tx.NextWriterEpoch()
		return err
	})
	if err != nil {
		return s, fmt.Errorf("journal writer epoch: %w", err)
	}
	n.crash("writer:restarting")
	spec, err := n.writerSpec(ctx, s, w)
	if err != nil {
		return s, err
	}
	if err := n.live(); err != nil {
		return s, err
	}
	// A re-attach waits for the kernel to take the socket and for a read
	// through it; a request in flight is retried after the request
	// timeout. Not cut by the end of the term: Start stops a writer whose
	// wait is cancelled, and one that already re-attached would take the
	// device down with it. Its epoch is journaled: the next primary
	// adopts it.
	req := n.cfg.Block.RequestTimeout
	if req <= 0 {
		req = writer.DefaultRequestTimeout
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), req+time.Minute)
	defer cancel()
	st, err := n.d.Block.Start(sctx, spec)
	if err != nil {
		return s, err
	}
	if st.Index != w.Index {
		// Never: a Reattach writer takes only the named device.
		return s, fmt.Errorf("the restarted %s attached %s, not /dev/nbd%d", w.what(), st.Device, w.Index)
	}
	w.PID = st.PID
	if s, err = n.putWriter(s, &w, nil); err != nil {
		return s, fmt.Errorf("journal restarted %s: %w", w.what(), err)
	}
	return s, nil
}

// loseWriter ends a ready generation whose writer could not be restarted
// as lost: torn down with a cleanup proof, as a takeover does with one
// whose kernel objects are gone.
func (n *Node) loseWriter(ctx context.Context, s journal.Sandbox, cause error) {
	reason := fmt.Sprintf("lost: %v", cause)
	n.log.Error("generation lost: its writer could not be restarted", "sandbox", s.ID, "generation", s.Generation, "err", cause)
	n.setState(s.ID, journal.StateLost, reason)
	if cur, err := n.sandbox(s.ID); err == nil && cur.Generation == s.Generation {
		s = cur
	}
	if _, err := n.teardown(ctx, s, "lost-"+s.ContainerID, journal.StateReleased, reason); err != nil {
		n.log.Warn("teardown of the lost generation", "sandbox", s.ID, "generation", s.Generation, "err", err)
	}
}
