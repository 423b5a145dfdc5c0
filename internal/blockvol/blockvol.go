// Package blockvol is the node's durable block roots over the block
// store and the writers (node.BlockVolumes and node.BlockSealer): sandbox
// ids are the sandbox volumes' ids, and the store's and writers' errors
// become API kinds.
package blockvol

import (
	"context"
	"errors"
	"fmt"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/writer"
)

// Volumes is node.BlockVolumes over a block store: the volumes of Kind
// (zero: sandboxes; blockstore.KindVolume for persistent volumes) named
// by their ids.
type Volumes struct {
	Repo *blockstore.Repo
	Kind blockstore.VolumeKind
}

// vol is the volume id names.
func (b Volumes) vol(id string) blockstore.Volume {
	if b.Kind == "" {
		return blockstore.Sandbox(id)
	}
	return blockstore.Volume{Kind: b.Kind, ID: id}
}

func storeHead(h journal.VolumeHead) blockstore.Head {
	return blockstore.Head{Seq: h.Seq, Generation: h.Generation, WriterEpoch: h.WriterEpoch, Node: h.Node}
}

func volumeHead(h blockstore.Head) journal.VolumeHead {
	return journal.VolumeHead{Seq: h.Seq, Generation: h.Generation, WriterEpoch: h.WriterEpoch, Node: h.Node}
}

// storeErr maps the store's refusals to API kinds; anything else is the
// store being unavailable.
func storeErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, blockstore.ErrFenced):
		return errdefs.Errorf(errdefs.CodeFenced, "%v", err)
	case errors.Is(err, blockstore.ErrExists), errors.Is(err, blockstore.ErrDeleted):
		return errdefs.Errorf(errdefs.CodeConflict, "%v", err)
	case errors.Is(err, blockstore.ErrNotFound):
		return errdefs.Errorf(errdefs.CodeNotFound, "%v", err)
	case errors.Is(err, blockstore.ErrInvalidKey):
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "%v", err)
	}
	return errdefs.Errorf(errdefs.CodeUnavailable, "block store: %v", err)
}

// Head is the sandbox volume's head (zero: none).
func (b Volumes) Head(ctx context.Context, sandbox string) (journal.VolumeHead, error) {
	h, err := b.Repo.Head(ctx, b.vol(sandbox))
	return volumeHead(h), storeErr(err)
}

// Publish is the head's compare-and-swap (fenced when lost).
func (b Volumes) Publish(ctx context.Context, sandbox string, expect, next journal.VolumeHead) (journal.VolumeHead, error) {
	h, err := b.Repo.Publish(ctx, b.vol(sandbox), storeHead(expect), storeHead(next))
	return volumeHead(h), storeErr(err)
}

// Generations lists the volume's committed generations.
func (b Volumes) Generations(ctx context.Context, sandbox string) ([]uint64, error) {
	g, err := b.Repo.Generations(ctx, b.vol(sandbox))
	return g, storeErr(err)
}

// DeviceSize is a committed generation's device size.
func (b Volumes) DeviceSize(ctx context.Context, sandbox string, generation uint64) (int64, error) {
	m, err := b.Repo.Manifest(ctx, blockstore.GenRef{Volume: b.vol(sandbox), Generation: generation})
	if err != nil {
		return 0, storeErr(err)
	}
	return int64(m.DeviceSize), nil
}

// PutSnapshot names a committed generation (conflict if taken).
func (b Volumes) PutSnapshot(ctx context.Context, sandbox, name string, generation uint64) error {
	return storeErr(b.Repo.PutSnapshot(ctx, b.vol(sandbox), name, generation))
}

// Snapshots lists the volume's named generations.
func (b Volumes) Snapshots(ctx context.Context, sandbox string) ([]blockstore.Snapshot, error) {
	ss, err := b.Repo.Snapshots(ctx, b.vol(sandbox))
	if err != nil {
		return nil, storeErr(err)
	}
	out := make([]blockstore.Snapshot, len(ss))
	for i, s := range ss {
		out[i] = blockstore.Snapshot{Name: s.Name, Generation: s.Generation}
	}
	return out, nil
}

// Fork commits dst@0 over src@generation (nothing copied).
func (b Volumes) Fork(ctx context.Context, src string, generation uint64, dst string) error {
	_, err := b.Repo.Fork(ctx, blockstore.GenRef{Volume: b.vol(src), Generation: generation}, b.vol(dst))
	return storeErr(err)
}

// ForkFrom commits dst@0 over src, any volume's generation.
func (b Volumes) ForkFrom(ctx context.Context, src blockstore.GenRef, dst string) error {
	_, err := b.Repo.Fork(ctx, src, b.vol(dst))
	return storeErr(err)
}

// Sealer is node.BlockSealer over the writers' supervisor.
type Sealer struct{ Supervisor *writer.Supervisor }

// Seal has dir's writer seal its device as the sandbox volume's
// generation; a stale epoch is fenced.
func (s Sealer) Seal(ctx context.Context, dir string, generation, epoch uint64) (journal.SealResult, error) {
	r, err := s.Supervisor.Seal(ctx, dir, writer.SealRequest{Generation: generation, Epoch: epoch})
	if err != nil {
		if errors.Is(err, writer.ErrStaleEpoch) {
			return journal.SealResult{}, errdefs.Errorf(errdefs.CodeFenced, "%v", err)
		}
		return journal.SealResult{}, fmt.Errorf("%w", err)
	}
	return journal.SealResult{
		Generation: r.Ref.Generation, Parent: r.Parent.String(),
		Chunks: r.Chunks, DataChunks: r.DataChunks, ZeroChunks: r.ZeroChunks, Bytes: r.Bytes,
		BarrierMS: float64(r.Barrier.Microseconds()) / 1000, SealMS: float64(r.Took.Microseconds()) / 1000,
	}, nil
}
