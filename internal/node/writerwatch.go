package node

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ctld/ctld/internal/node/journal"
	"github.com/ctld/ctld/internal/writer"
)

// A block generation's writer that dies (kill -9, OOM, a crash) leaves
// its /dev/nbdX configured: the kernel holds the guest's I/O for the
// dead-connection timeout, waiting for a fresh socket. The primary
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

// WatchWriters checks the writer of every ready block generation every
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

// checkWriters checks each ready block generation's writer once.
func (n *Node) checkWriters(ctx context.Context) {
	var ss []journal.Sandbox
	err := n.d.Journal.View(func(tx *journal.Tx) error {
		all, err := tx.LiveSandboxes()
		for _, s := range all {
			if s.State == journal.StateReady && rootfsMode(s) == journal.RootFSBlock {
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
		if ctx.Err() != nil {
			return
		}
		switch err := n.writerRuns(ctx, s); {
		case err == nil:
		case errors.Is(err, writer.ErrNotRunning):
			n.writerDied(ctx, s.ID, s.Generation, err)
		default:
			// Not known dead (e.g. /proc unreadable): a restart would find
			// a live writer and fail, and the generation would be lost.
			n.log.Warn("writers' watch: check writer", "sandbox", s.ID, "generation", s.Generation, "err", err)
		}
	}
}

// writerRuns is nil when s's writer runs with s's journaled epoch. A pid
// the journal does not know yet (a restart the last primary did not get
// to journal) is journaled.
func (n *Node) writerRuns(ctx context.Context, s journal.Sandbox) error {
	if s.Block == nil {
		return fmt.Errorf("%w: no writer journaled", writer.ErrNotRunning)
	}
	st, err := n.d.Block.Check(ctx, n.writerDir(s))
	if err != nil {
		return err
	}
	if st.Epoch != s.Block.WriterEpoch {
		return fmt.Errorf("%w: the dir's writer is of epoch %d, the journal's %d", writer.ErrNotRunning, st.Epoch, s.Block.WriterEpoch)
	}
	if st.PID != s.Block.PID && st.Index == s.Block.Index {
		b := *s.Block
		b.PID = st.PID
		if err := n.putBlock(s, &b, nil); err != nil {
			n.log.Warn("journal the writer's pid", "sandbox", s.ID, "generation", s.Generation, "err", err)
		}
	}
	return nil
}

// writerDied restarts the writer of generation gen of sandbox id, which
// the watch found dead (cause), or, if that fails, ends the generation as
// lost. It is an operation of the term and holds the sandbox's lock, so a
// release waits for it and then finds the generation as it left it.
func (n *Node) writerDied(ctx context.Context, id string, gen uint64, cause error) {
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
	if err := n.writerRuns(ctx, s); !errors.Is(err, writer.ErrNotRunning) {
		return
	}
	if _, err := n.restartWriter(ctx, s, cause); err != nil {
		if n.live() != nil {
			return // the next primary's reconcile decides
		}
		n.loseWriter(ctx, s, err)
	}
}

// restartWriter starts the next writer of s on its dir and device (see
// the top of this file): up to RestartAttempts times, each with a new
// writer epoch journaled before the start. It returns s as journaled
// with the new writer.
func (n *Node) restartWriter(ctx context.Context, s journal.Sandbox, cause error) (journal.Sandbox, error) {
	if s.Block == nil || s.Block.Index < 0 {
		return s, errors.New("no device journaled for the dead writer: nothing to re-attach")
	}
	attempts := n.cfg.Block.RestartAttempts
	if attempts <= 0 {
		attempts = DefaultWriterRestarts
	}
	start := time.Now()
	log := n.log.With("sandbox", s.ID, "generation", s.Generation, "device", "/dev/nbd"+strconv.Itoa(s.Block.Index))
	log.Warn("writer died; restarting it on the same device", "old_epoch", s.Block.WriterEpoch, "old_pid", s.Block.PID, "cause", cause)
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
		rs, err := n.startNextWriter(ctx, s)
		if err == nil {
			log.Info("writer restarted", "epoch", rs.Block.WriterEpoch, "pid", rs.Block.PID, "attempt", attempt,
				"restarts", rs.Block.Restarts, "after_ms", time.Since(start).Milliseconds())
			return rs, nil
		}
		log.Warn("writer restart failed", "attempt", attempt, "of", attempts, "err", err)
		errs = append(errs, fmt.Errorf("attempt %d: %w", attempt, err))
		if rs.Block != nil {
			s = rs
		}
	}
	return s, fmt.Errorf("writer died (%v) and was not restarted: %w", cause, errors.Join(errs...))
}

// startNextWriter journals the next writer epoch on s's record and starts
// a writer of that epoch that re-attaches s's device.
func (n *Node) startNextWriter(ctx context.Context, s journal.Sandbox) (journal.Sandbox, error) {
	b := *s.Block
	err := n.putBlock(s, &b, func(tx *journal.Tx) (err error) {
		b.Restarts++
		b.WriterEpoch, err = tx.NextWriterEpoch()
		return err
	})
	if err != nil {
		return s, fmt.Errorf("journal writer epoch: %w", err)
	}
	s.Block = &b
	n.crash("writer:restarting")
	base, err := n.baseOf(ctx, b)
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
	st, err := n.d.Block.Start(sctx, writer.Spec{
		Sandbox: s.ID, Generation: s.Generation, Epoch: b.WriterEpoch,
		StoreDir: n.cfg.Block.StoreDir, Store: n.cfg.Block.Store, NodeKeyFile: n.cfg.Block.NodeKeyFile, NodeKeyID: n.cfg.Block.NodeKeyID,
		Base: base, Dir: b.Dir, Index: b.Index, Reattach: true,
		DeadConnTimeout: n.cfg.Block.DeadConnTimeout, RequestTimeout: n.cfg.Block.RequestTimeout,
	})
	if err != nil {
		return s, err
	}
	if st.Index != b.Index {
		// Never: a Reattach writer takes only the named device.
		return s, fmt.Errorf("the restarted writer attached %s, not /dev/nbd%d", st.Device, b.Index)
	}
	b.PID = st.PID
	if err := n.putBlock(s, &b, nil); err != nil {
		return s, fmt.Errorf("journal restarted writer: %w", err)
	}
	s.Block = &b
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
