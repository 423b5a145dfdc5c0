package blockroot

import (
	"context"
	"errors"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/writers"
)

// Writers are the block roots' writer records (writers.Set).
func (n *Root) Writers() writers.Set { return rootWriters{n} }

type rootWriters struct{ n *Root }

func (rootWriters) Watched(s journal.Sandbox) []string {
	if writers.RootFSMode(s) == journal.RootFSBlock {
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
