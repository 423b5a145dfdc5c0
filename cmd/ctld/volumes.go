package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/writer"
)

// blockVolumes is node.BlockVolumes over the block store: sandbox ids are
// the sandbox volumes' ids, and the store's errors become API kinds.
type blockVolumes struct{ repo *blockstore.Repo }

func storeHead(h api.VolumeHead) blockstore.Head {
	return blockstore.Head{Seq: h.Seq, Generation: h.Generation, WriterEpoch: h.WriterEpoch, Node: h.Node}
}

func volumeHead(h blockstore.Head) api.VolumeHead {
	return api.VolumeHead{Seq: h.Seq, Generation: h.Generation, WriterEpoch: h.WriterEpoch, Node: h.Node}
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

func (b blockVolumes) Head(ctx context.Context, sandbox string) (api.VolumeHead, error) {
	h, err := b.repo.Head(ctx, blockstore.Sandbox(sandbox))
	return volumeHead(h), storeErr(err)
}

func (b blockVolumes) Publish(ctx context.Context, sandbox string, expect, next api.VolumeHead) (api.VolumeHead, error) {
	h, err := b.repo.Publish(ctx, blockstore.Sandbox(sandbox), storeHead(expect), storeHead(next))
	return volumeHead(h), storeErr(err)
}

func (b blockVolumes) Generations(ctx context.Context, sandbox string) ([]uint64, error) {
	g, err := b.repo.Generations(ctx, blockstore.Sandbox(sandbox))
	return g, storeErr(err)
}

func (b blockVolumes) DeviceSize(ctx context.Context, sandbox string, generation uint64) (int64, error) {
	m, err := b.repo.Manifest(ctx, blockstore.GenRef{Volume: blockstore.Sandbox(sandbox), Generation: generation})
	if err != nil {
		return 0, storeErr(err)
	}
	return int64(m.DeviceSize), nil
}

func (b blockVolumes) PutSnapshot(ctx context.Context, sandbox, name string, generation uint64) error {
	return storeErr(b.repo.PutSnapshot(ctx, blockstore.Sandbox(sandbox), name, generation))
}

func (b blockVolumes) Snapshots(ctx context.Context, sandbox string) ([]api.Snapshot, error) {
	ss, err := b.repo.Snapshots(ctx, blockstore.Sandbox(sandbox))
	if err != nil {
		return nil, storeErr(err)
	}
	out := make([]api.Snapshot, len(ss))
	for i, s := range ss {
		out[i] = api.Snapshot{Name: s.Name, Generation: s.Generation}
	}
	return out, nil
}

func (b blockVolumes) Fork(ctx context.Context, src string, generation uint64, dst string) error {
	_, err := b.repo.Fork(ctx, blockstore.GenRef{Volume: blockstore.Sandbox(src), Generation: generation}, blockstore.Sandbox(dst))
	return storeErr(err)
}

// blockSealer is node.BlockSealer over the writers' supervisor.
type blockSealer struct{ sup *writer.Supervisor }

func (s blockSealer) Seal(ctx context.Context, dir string, generation, epoch uint64) (api.SealResult, error) {
	r, err := s.sup.Seal(ctx, dir, writer.SealRequest{Generation: generation, Epoch: epoch})
	if err != nil {
		if errors.Is(err, writer.ErrStaleEpoch) {
			return api.SealResult{}, errdefs.Errorf(errdefs.CodeFenced, "%v", err)
		}
		return api.SealResult{}, fmt.Errorf("%w", err)
	}
	return api.SealResult{
		Generation: r.Ref.Generation, Parent: r.Parent.String(),
		Chunks: r.Chunks, DataChunks: r.DataChunks, ZeroChunks: r.ZeroChunks, Bytes: r.Bytes,
		BarrierMS: float64(r.Barrier.Microseconds()) / 1000, SealMS: float64(r.Took.Microseconds()) / 1000,
	}, nil
}
