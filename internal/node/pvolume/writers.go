package pvolume

import (
	"context"
	"fmt"
	"slices"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/writers"
)

// Writers are the persistent volumes' writer records (writers.Set).
type Writers struct{ Journal *journal.Journal }

func (Writers) Watched(s journal.Sandbox) []string {
	var out []string
	for _, v := range s.Volumes {
		if v.Published == nil && v.PublishError == "" {
			out = append(out, v.ID)
		}
	}
	return out
}

func (Writers) Get(s journal.Sandbox, vol string) (writers.Writer, bool) {
	i := slices.IndexFunc(s.Volumes, func(v journal.AttachedVolume) bool { return v.ID == vol })
	if i < 0 {
		return writers.Writer{Volume: vol, Index: -1}, false
	}
	v := s.Volumes[i]
	return writers.Writer{Volume: vol, Epoch: v.WriterEpoch, Dir: v.Dir, Index: v.Index, PID: v.PID, Restarts: v.Restarts}, true
}

func (r Writers) Put(s journal.Sandbox, w *writers.Writer, also func(*journal.Tx) error) (journal.Sandbox, error) {
	i := slices.IndexFunc(s.Volumes, func(v journal.AttachedVolume) bool { return v.ID == w.Volume })
	if i < 0 {
		return s, fmt.Errorf("no attach of volume %s journaled", w.Volume)
	}
	av := s.Volumes[i]
	err := putVolume(r.Journal, s, &av, func(tx *journal.Tx) error {
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

func (Writers) Base(_ context.Context, s journal.Sandbox, w writers.Writer) (blockstore.GenRef, error) {
	i := slices.IndexFunc(s.Volumes, func(v journal.AttachedVolume) bool { return v.ID == w.Volume })
	if i < 0 {
		return blockstore.GenRef{}, fmt.Errorf("no attach of volume %s journaled", w.Volume)
	}
	return blockstore.GenRef{Volume: blockstore.Vol(w.Volume), Generation: s.Volumes[i].Head.Generation}, nil
}
