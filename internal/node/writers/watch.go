package writers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/op"
	"github.com/ctld/ctld/internal/writer"
)

// A generation's writer (its block root's, or a persistent volume's)
// that dies (kill -9, OOM, a crash) leaves its /dev/nbdX configured: the
// kernel holds the guest's I/O for the dead-connection timeout, waiting
// for a fresh socket. The primary
// notices the death (Watch.Run, or Reconcile on takeover) and starts
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
	DefaultCheck    = time.Second
	DefaultRestarts = 3
)

// Writer is one writer of a generation as journaled: its root's (Volume
// "") or a persistent volume's (Volume its id). The watch, the takeover
// and a volume's detach restart either the same way.
type Writer struct {
	Volume   string
	Epoch    uint64
	Dir      string
	Index    int
	PID      int
	Restarts int
}

// What names w in logs and errors.
func (w Writer) What() string {
	if w.Volume == "" {
		return "writer"
	}
	return "volume writer " + w.Volume
}

// Set is what the watch needs of the records of one kind of writer: the
// root's (blockroot) or the persistent volumes' (pvolume).
type Set interface {
	// Watched are the writers of ready generation s the watch keeps
	// running ("": the root's; else volume ids).
	Watched(s journal.Sandbox) []string
	// Get is s's journaled writer of volume vol ("": the root's); ok is
	// false when s journals none (w still names its Dir and Index -1 as
	// far as known).
	Get(s journal.Sandbox, vol string) (w Writer, ok bool)
	// Put journals *w on s's record and returns s with it; also runs
	// first in the same transaction and may change *w (the epoch).
	Put(s journal.Sandbox, w *Writer, also func(*journal.Tx) error) (journal.Sandbox, error)
	// Base is the generation w's next writer writes over.
	Base(ctx context.Context, s journal.Sandbox, w Writer) (blockstore.GenRef, error)
}

// Loser ends a ready generation whose writer could not be restarted as
// lost (the node's teardown with a cleanup proof).
type Loser interface {
	LoseWriter(ctx context.Context, s journal.Sandbox, cause error)
}

// LoserFunc is a func as a Loser.
type LoserFunc func(ctx context.Context, s journal.Sandbox, cause error)

// LoseWriter calls f.
func (f LoserFunc) LoseWriter(ctx context.Context, s journal.Sandbox, cause error) { f(ctx, s, cause) }

// Watch checks and restarts the writers of ready generations.
type Watch struct {
	Config  Config
	Devices Devices // nil: no block mode, nothing to watch
	Journal *journal.Journal
	Term    *op.Term
	Locks   *op.Locks // the sandboxes' locks (a restart holds one)
	// Crash is the crash hook (op.Runner.Crash).
	Crash func(point string)
	// Stopped says whether the node closed.
	Stopped func() bool
	Log     *slog.Logger
	// Root is the root writers' records, Volumes the persistent volumes'.
	Root, Volumes Set
	Loser         Loser
}

// set is the Set of volume vol's writers ("": the root's).
func (x *Watch) set(vol string) Set {
	if vol == "" {
		return x.Root
	}
	return x.Volumes
}

// Run checks the writers of every ready generation every CheckEvery, and
// restarts the dead ones, until ctx (the term) ends or the node closes.
func (x *Watch) Run(ctx context.Context) {
	if x.Devices == nil {
		return
	}
	every := x.Config.CheckEvery
	if every <= 0 {
		every = DefaultCheck
	}
	op.EveryTick(ctx, every, x.Stopped, func() { x.checkWriters(ctx) })
}

// Get is s's journaled writer of volume vol ("": the root's); ok is
// false when s journals none.
func (x *Watch) Get(s journal.Sandbox, vol string) (Writer, bool) { return x.set(vol).Get(s, vol) }

// watched are the writers of ready generation s the watch keeps
// running: the root's (block mode) and each attached volume's.
func (x *Watch) watched(s journal.Sandbox) []string {
	return append(x.Root.Watched(s), x.Volumes.Watched(s)...)
}

// writerSpec is the spec of w's next writer (a re-attach of its device):
// the root's over its journaled base, a volume's over the head its attach
// started from (a volume is sealed only at its detach).
func (x *Watch) writerSpec(ctx context.Context, s journal.Sandbox, w Writer) (writer.Spec, error) {
	spec := x.Config.Spec(s.ID, s.Generation, w.Epoch, blockstore.GenRef{}, w.Dir)
	spec.Index, spec.Reattach = w.Index, true
	base, err := x.set(w.Volume).Base(ctx, s, w)
	if err != nil {
		return spec, err
	}
	if w.Volume != "" {
		spec.Volume = blockstore.Vol(w.Volume)
	}
	spec.Base = base
	return spec, nil
}

// checkWriters checks the writers of each ready generation once.
func (x *Watch) checkWriters(ctx context.Context) {
	var ss []journal.Sandbox
	err := x.Journal.View(func(tx *journal.Tx) error {
		all, err := tx.LiveSandboxes()
		for _, s := range all {
			if s.State == journal.StateReady && len(x.watched(s)) > 0 {
				ss = append(ss, s)
			}
		}
		return err
	})
	if err != nil {
		x.Log.Error("writers' watch: read journal", "err", err)
		return
	}
	for _, s := range ss {
		for _, vol := range x.watched(s) {
			if ctx.Err() != nil {
				return
			}
			switch err := x.Runs(ctx, s, vol); {
			case err == nil:
			case errors.Is(err, writer.ErrNotRunning):
				x.writerDied(ctx, s.ID, s.Generation, vol, err)
			default:
				// Not known dead (e.g. /proc unreadable): a restart would find
				// a live writer and fail, and the generation would be lost.
				x.Log.Warn("writers' watch: check writer", "sandbox", s.ID, "generation", s.Generation, "volume", vol, "err", err)
			}
		}
	}
}

// Runs is nil when s's writer of volume vol ("": the root's) runs with
// its journaled epoch. A pid the journal does not know yet (a restart
// the last primary did not get to journal) is journaled.
func (x *Watch) Runs(ctx context.Context, s journal.Sandbox, vol string) error {
	w, ok := x.Get(s, vol)
	if !ok {
		return fmt.Errorf("%w: no %s journaled", writer.ErrNotRunning, w.What())
	}
	st, err := x.Devices.Check(ctx, w.Dir)
	if err != nil {
		return err
	}
	if st.Epoch != w.Epoch {
		return fmt.Errorf("%w: the dir's %s is of epoch %d, the journal's %d", writer.ErrNotRunning, w.What(), st.Epoch, w.Epoch)
	}
	if st.PID != w.PID && st.Index == w.Index {
		w.PID = st.PID
		if _, err := x.set(vol).Put(s, &w, nil); err != nil {
			x.Log.Warn("journal the writer's pid", "sandbox", s.ID, "generation", s.Generation, "volume", vol, "err", err)
		}
	}
	return nil
}

// Dead are the writers of ready generation s that a takeover finds not
// running with their journaled epochs (the node's missing test).
func (x *Watch) Dead(ctx context.Context, s journal.Sandbox) []string {
	var dead []string
	for _, vol := range x.watched(s) {
		if x.Runs(ctx, s, vol) != nil {
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
func (x *Watch) writerDied(ctx context.Context, id string, gen uint64, vol string, cause error) {
	ctx, done, err := x.Term.Begin(ctx)
	if err != nil {
		return
	}
	defer done()
	unlock := x.Locks.Lock(id)
	defer unlock()
	var s journal.Sandbox
	var found bool
	err = x.Journal.View(func(tx *journal.Tx) (err error) {
		s, found, err = tx.Sandbox(id)
		return err
	})
	if err != nil || !found || s.Generation != gen || s.State != journal.StateReady {
		return // released or replaced meanwhile
	}
	if err := x.Runs(ctx, s, vol); !errors.Is(err, writer.ErrNotRunning) {
		return
	}
	if _, err := x.Restart(ctx, s, vol, cause); err != nil {
		if x.Term.Live() != nil {
			return // the next primary's reconcile decides
		}
		x.Loser.LoseWriter(ctx, s, err)
	}
}

// Restart starts the next writer of volume vol ("": the root's) of s on
// its dir and device (see the top of this file): up to RestartAttempts
// times, each with a new writer epoch journaled before the start. It
// returns s as journaled with the new writer.
func (x *Watch) Restart(ctx context.Context, s journal.Sandbox, vol string, cause error) (journal.Sandbox, error) {
	w, ok := x.Get(s, vol)
	if !ok || w.Index < 0 {
		return s, fmt.Errorf("no device journaled for the dead %s: nothing to re-attach", w.What())
	}
	attempts := x.Config.RestartAttempts
	if attempts <= 0 {
		attempts = DefaultRestarts
	}
	start := time.Now()
	log := x.Log.With("sandbox", s.ID, "generation", s.Generation, "volume", vol, "device", "/dev/nbd"+strconv.Itoa(w.Index))
	log.Warn(w.What()+" died; restarting it on the same device", "old_epoch", w.Epoch, "old_pid", w.PID, "cause", cause)
	var errs []error
	for attempt := 1; attempt <= attempts; attempt++ {
		if attempt > 1 {
			// The guest's I/O fails once the dead-connection timeout
			// passed: restarting after that saves nothing.
			if d := x.Config.DeadConnTimeout; d > 0 && time.Since(start) >= d {
				errs = append(errs, fmt.Errorf("the dead-connection timeout (%v) passed", d))
				break
			}
			select {
			case <-ctx.Done():
				return s, errors.Join(append(errs, ctx.Err())...)
			case <-time.After(time.Duration(attempt-1) * time.Second):
			}
		}
		if err := x.Term.Live(); err != nil {
			return s, err
		}
		rs, err := x.startNextWriter(ctx, s, vol)
		if err == nil {
			nw, _ := x.Get(rs, vol)
			log.Info(w.What()+" restarted", "epoch", nw.Epoch, "pid", nw.PID, "attempt", attempt,
				"restarts", nw.Restarts, "after_ms", time.Since(start).Milliseconds())
			return rs, nil
		}
		log.Warn(w.What()+" restart failed", "attempt", attempt, "of", attempts, "err", err)
		errs = append(errs, fmt.Errorf("attempt %d: %w", attempt, err))
		s = rs
	}
	return s, fmt.Errorf("%s died (%v) and was not restarted: %w", w.What(), cause, errors.Join(errs...))
}

// startNextWriter journals the next writer epoch on s's record of
// volume vol's writer ("": the root's) and starts a writer of that epoch
// that re-attaches its device.
func (x *Watch) startNextWriter(ctx context.Context, s journal.Sandbox, vol string) (journal.Sandbox, error) {
	w, ok := x.Get(s, vol)
	if !ok {
		return s, fmt.Errorf("no %s journaled", w.What())
	}
	set := x.set(vol)
	s, err := set.Put(s, &w, func(tx *journal.Tx) (err error) {
		w.Restarts++
		w.Epoch, err = tx.NextWriterEpoch()
		return err
	})
	if err != nil {
		return s, fmt.Errorf("journal writer epoch: %w", err)
	}
	x.Crash("writer:restarting")
	spec, err := x.writerSpec(ctx, s, w)
	if err != nil {
		return s, err
	}
	if err := x.Term.Live(); err != nil {
		return s, err
	}
	// A re-attach waits for the kernel to take the socket and for a read
	// through it; a request in flight is retried after the request
	// timeout. Not cut by the end of the term: Start stops a writer whose
	// wait is cancelled, and one that already re-attached would take the
	// device down with it. Its epoch is journaled: the next primary
	// adopts it.
	req := x.Config.RequestTimeout
	if req <= 0 {
		req = writer.DefaultRequestTimeout
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), req+time.Minute)
	defer cancel()
	st, err := x.Devices.Start(sctx, spec)
	if err != nil {
		return s, err
	}
	if st.Index != w.Index {
		// Never: a Reattach writer takes only the named device.
		return s, fmt.Errorf("the restarted %s attached %s, not /dev/nbd%d", w.What(), st.Device, w.Index)
	}
	w.PID = st.PID
	if s, err = set.Put(s, &w, nil); err != nil {
		return s, fmt.Errorf("journal restarted %s: %w", w.What(), err)
	}
	return s, nil
}
