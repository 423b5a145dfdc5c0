package fakekernel

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
)

// The block store's volumes (node.BlockVolumes), the writers' seal
// (node.BlockSealer) and the roots' freeze (node.BlockFreezer), in memory.
// A volume has committed generations, a head with a publish counter, and
// named snapshots; a fork's generation 0 names its source.

type fakeVolume struct {
	gens  map[uint64]string // generation → what it was sealed from ("seal of DIR", "fork of SRC@N")
	head  journal.VolumeHead
	snaps []blockstore.Snapshot
}

func (k *Kernel) vol(id string) *fakeVolume {
	if k.vols == nil {
		k.vols = map[string]*fakeVolume{}
	}
	v, ok := k.vols[id]
	if !ok {
		v = &fakeVolume{gens: map[uint64]string{}}
		k.vols[id] = v
	}
	return v
}

// Volumes is the fake's node.BlockVolumes.
func (k *Kernel) Volumes() *Volumes { return (*Volumes)(k) }

// Sealer is the fake's node.BlockSealer.
func (k *Kernel) Sealer() *Sealer { return (*Sealer)(k) }

// Freezer is the fake's node.BlockFreezer.
func (k *Kernel) Freezer() *Freezer { return (*Freezer)(k) }

// Volumes fakes the block store's volumes.
type Volumes Kernel

// Head returns the volume's head (zero: none).
func (v *Volumes) Head(ctx context.Context, sandbox string) (journal.VolumeHead, error) {
	k := (*Kernel)(v)
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.vol(sandbox).head, nil
}

// Publish is the compare-and-swap of the head: fenced unless the head is
// expect and next's epoch is not older.
func (v *Volumes) Publish(ctx context.Context, sandbox string, expect, next journal.VolumeHead) (journal.VolumeHead, error) {
	k := (*Kernel)(v)
	k.mu.Lock()
	defer k.mu.Unlock()
	vol := k.vol(sandbox)
	switch {
	case vol.head.Seq != expect.Seq:
		return journal.VolumeHead{}, errdefs.Errorf(errdefs.CodeFenced, "publish of %s refused: the head is at %d, the writer started from %d", sandbox, vol.head.Seq, expect.Seq)
	case next.WriterEpoch < vol.head.WriterEpoch:
		return journal.VolumeHead{}, errdefs.Errorf(errdefs.CodeFenced, "publish of %s refused: writer epoch %d is older than the head's %d", sandbox, next.WriterEpoch, vol.head.WriterEpoch)
	}
	if _, ok := vol.gens[next.Generation]; !ok {
		return journal.VolumeHead{}, fmt.Errorf("publish of %s: generation %d is not committed", sandbox, next.Generation)
	}
	next.Seq = vol.head.Seq + 1
	vol.head = next
	k.call("publish %s head %d generation %d epoch %d", sandbox, next.Seq, next.Generation, next.WriterEpoch)
	return next, nil
}

// Generations lists the committed generations.
func (v *Volumes) Generations(ctx context.Context, sandbox string) ([]uint64, error) {
	k := (*Kernel)(v)
	k.mu.Lock()
	defer k.mu.Unlock()
	out := []uint64{}
	for g := range k.vol(sandbox).gens {
		out = append(out, g)
	}
	slices.Sort(out)
	return out, nil
}

// DeviceSize is TemplateSize for every committed generation.
func (v *Volumes) DeviceSize(ctx context.Context, sandbox string, generation uint64) (int64, error) {
	k := (*Kernel)(v)
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.vol(sandbox).gens[generation]; !ok {
		return 0, errdefs.Errorf(errdefs.CodeNotFound, "%s@%d is not committed", sandbox, generation)
	}
	return TemplateSize, nil
}

// PutSnapshot names a committed generation.
func (v *Volumes) PutSnapshot(ctx context.Context, sandbox, name string, generation uint64) error {
	k := (*Kernel)(v)
	k.mu.Lock()
	defer k.mu.Unlock()
	vol := k.vol(sandbox)
	for _, s := range vol.snaps {
		if s.Name == name {
			return errdefs.Errorf(errdefs.CodeConflict, "snapshot %q of %s exists", name, sandbox)
		}
	}
	vol.snaps = append(vol.snaps, blockstore.Snapshot{Name: name, Generation: generation})
	k.call("snapshot %s %s generation %d", sandbox, name, generation)
	return nil
}

// Snapshots lists the named generations.
func (v *Volumes) Snapshots(ctx context.Context, sandbox string) ([]blockstore.Snapshot, error) {
	k := (*Kernel)(v)
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]blockstore.Snapshot{}, k.vol(sandbox).snaps...), nil
}

// Fork commits dst's generation 0 over src@generation.
func (v *Volumes) Fork(ctx context.Context, src string, generation uint64, dst string) error {
	k := (*Kernel)(v)
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.vol(src).gens[generation]; !ok {
		return errdefs.Errorf(errdefs.CodeNotFound, "%s@%d is not committed", src, generation)
	}
	d := k.vol(dst)
	if len(d.gens) > 0 {
		return errdefs.Errorf(errdefs.CodeConflict, "fork onto %s: it has generations already", dst)
	}
	d.gens[0] = fmt.Sprintf("fork of %s@%d", src, generation)
	k.call("fork %s@%d to %s", src, generation, dst)
	return nil
}

// ForkFrom commits dst's generation 0 over src: a template's generation
// 0 (the fake's templates have only that) or a committed generation of
// one of its volumes.
func (v *Volumes) ForkFrom(ctx context.Context, src blockstore.GenRef, dst string) error {
	k := (*Kernel)(v)
	k.mu.Lock()
	defer k.mu.Unlock()
	if src.Volume.Kind != blockstore.KindTemplate || src.Generation != 0 {
		if _, ok := k.vol(src.Volume.ID).gens[src.Generation]; !ok {
			return errdefs.Errorf(errdefs.CodeNotFound, "%s is not committed", src)
		}
	}
	d := k.vol(dst)
	if len(d.gens) > 0 || d.head.Seq > 0 {
		return errdefs.Errorf(errdefs.CodeConflict, "fork onto %s: it has generations or a head already", dst)
	}
	d.gens[0] = fmt.Sprintf("fork of %s", src)
	k.call("fork %s to %s", src, dst)
	return nil
}

// Sealer fakes writer.Supervisor.Seal.
type Sealer Kernel

// Seal commits the dir's writer's device as generation of its sandbox's
// volume: refused without a live writer, for another epoch, or for a
// generation that exists.
func (s *Sealer) Seal(ctx context.Context, dir string, generation, epoch uint64) (journal.SealResult, error) {
	k := (*Kernel)(s)
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.makeFails("seal", filepath.Base(dir)); err != nil {
		return journal.SealResult{}, err
	}
	w, ok := k.writers[dir]
	if !ok || !w.alive {
		return journal.SealResult{}, fmt.Errorf("seal %s: writer not running", dir)
	}
	if w.epoch != epoch {
		return journal.SealResult{}, fmt.Errorf("seal %s: writer epoch %d, asked for %d: stale", dir, w.epoch, epoch)
	}
	key := w.sandbox
	if w.volume != "" {
		key = w.volume
	}
	vol := k.vol(key)
	if _, ok := vol.gens[generation]; ok {
		return journal.SealResult{}, fmt.Errorf("seal %s: generation %d exists", dir, generation)
	}
	vol.gens[generation] = "seal of " + filepath.Base(dir)
	k.call("seal %s generation %d epoch %d", filepath.Base(dir), generation, epoch)
	return journal.SealResult{Generation: generation, Chunks: 1, DataChunks: 1, Bytes: 64 << 10}, nil
}

// Freezer fakes the FIFREEZE of a block root.
type Freezer Kernel

// Freeze freezes the mounted root of container id until thaw.
func (f *Freezer) Freeze(ctx context.Context, id string) (func() error, error) {
	k := (*Kernel)(f)
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.bmounts[id]; !ok {
		return nil, fmt.Errorf("freeze %s: no block root mounted", id)
	}
	if k.frozen == nil {
		k.frozen = map[string]bool{}
	}
	if k.frozen[id] {
		return nil, fmt.Errorf("freeze %s: frozen already", id)
	}
	k.frozen[id] = true
	k.call("freeze %s", id)
	return func() error {
		k.mu.Lock()
		defer k.mu.Unlock()
		delete(k.frozen, id)
		k.call("thaw %s", id)
		return nil
	}, nil
}

// Thaw thaws the root of container id if frozen.
func (f *Freezer) Thaw(ctx context.Context, id string) error {
	k := (*Kernel)(f)
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.frozen[id] {
		delete(k.frozen, id)
		k.call("thaw %s", id)
	}
	return nil
}

// SetHead sets sandbox's head as a hostile bucket can: deleting the
// newest head object, or putting back a saved older one (Seq 0: every
// head gone).
func (k *Kernel) SetHead(sandbox string, h journal.VolumeHead) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.vol(sandbox).head = h
}
