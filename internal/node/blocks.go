package node

import (
	"context"
	"errors"
	"fmt"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/pvolume"
	"github.com/ctld/ctld/internal/node/writers"
)

// The node's wiring of block roots and persistent volumes: the writers'
// watch (internal/node/writers) over the records of both, and what of it
// the node still does itself (a lost generation's teardown).

// Defaults of the writers' watch (writers.DefaultCheck, DefaultRestarts).
const (
	DefaultWriterCheck    = writers.DefaultCheck
	DefaultWriterRestarts = writers.DefaultRestarts
)

// WatchWriters checks the writers of every ready generation every
// CheckEvery, and restarts the dead ones, until ctx (the term) ends or
// the node closes (writers.Watch.Run).
func (n *Node) WatchWriters(ctx context.Context) { n.writers().Run(ctx) }

// writers is the watch over this node's writers.
func (n *Node) writers() *writers.Watch {
	return &writers.Watch{
		Config: n.cfg.Block, Devices: n.d.Block, Journal: n.d.Journal, Term: n.term, Locks: &n.locks,
		Crash: n.crash, Stopped: n.isClosed, Log: n.log,
		Root: rootWriters{n}, Volumes: pvolume.Writers{Journal: n.d.Journal}, Loser: writers.LoserFunc(n.loseWriter),
	}
}

// pvolumes is this node's persistent volumes (the volumes entry).
func (n *Node) pvolumes() *pvolume.Volumes {
	return pvolume.New(pvolume.Deps{
		Config: n.cfg.Block, Journal: n.d.Journal, Devices: n.d.Block, Sealer: n.d.Sealer,
		Store: n.d.PVolumes, Mounts: n.d.VolumeMounts, Freezer: n.d.VolumeFreezer, NodeID: n.d.Identity.NodeID,
		Term: n.term, Crash: n.crash, Log: n.log, Watch: n.writers(),
	})
}

// marks are this node's head marks (writers.Marks).
func (n *Node) marks() writers.Marks { return writers.Marks{Journal: n.d.Journal, Log: n.log} }

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

// rootWriters are the block roots' writer records (writers.Set).
type rootWriters struct{ n *Node }

func (rootWriters) Watched(s journal.Sandbox) []string {
	if rootfsMode(s) == journal.RootFSBlock {
		return []string{""}
	}
	return nil
}

func (r rootWriters) Get(s journal.Sandbox, _ string) (writers.Writer, bool) {
	if s.Block == nil {
		return writers.Writer{Dir: r.n.writerDir(s), Index: -1}, false
	}
	b := s.Block
	return writers.Writer{Epoch: b.WriterEpoch, Dir: r.n.writerDir(s), Index: b.Index, PID: b.PID, Restarts: b.Restarts}, true
}

func (r rootWriters) Put(s journal.Sandbox, w *writers.Writer, also func(*journal.Tx) error) (journal.Sandbox, error) {
	if s.Block == nil {
		return s, errors.New("no writer journaled")
	}
	b := *s.Block
	err := r.n.putBlock(s, &b, func(tx *journal.Tx) error {
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

func (r rootWriters) Base(ctx context.Context, s journal.Sandbox, _ writers.Writer) (blockstore.GenRef, error) {
	return r.n.baseOf(ctx, *s.Block)
}
