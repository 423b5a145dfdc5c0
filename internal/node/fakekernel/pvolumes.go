package fakekernel

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/journal"
)

// Persistent volumes (node.Deps PVolumes, VolumeMounts, VolumeFreezer):
// the store's volumes of kind volumes, kept beside the sandboxes' in the
// same map under "volumes/<id>", and their devices' mounts, in a map and
// a mount dir of their own (keyed by volume id), as ctld's rootfs.Block
// over its own dir.

func pvolKey(id string) string { return "volumes/" + id }

// KindVolumeMount is the fake's kind of a volume mount (for Refuse and
// FailMake).
const KindVolumeMount = "volmount"

// VolumeMountDir holds the persistent volumes' mount points.
func (k *Kernel) VolumeMountDir() string { return filepath.Join(k.root, "volmounts") }

// CreateVolume makes persistent volume id: generation 0 and head 1, as
// `ctl-manager volume create` does.
func (k *Kernel) CreateVolume(id string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	v := k.vol(pvolKey(id))
	v.gens[0] = "created"
	v.head = journal.VolumeHead{Seq: 1, Generation: 0, Node: "ctl-manager"}
}

// VolumeHead is persistent volume id's head.
func (k *Kernel) VolumeHead(id string) journal.VolumeHead {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.vol(pvolKey(id)).head
}

// MoveVolumeHead publishes a head of id as another node would: the next
// seq over generation 0 with writer epoch epoch.
func (k *Kernel) MoveVolumeHead(id string, epoch uint64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	v := k.vol(pvolKey(id))
	v.head = journal.VolumeHead{Seq: v.head.Seq + 1, Generation: 0, WriterEpoch: epoch, Node: "elsewhere"}
}

// PVolumes is the fake's persistent volumes (writers.Volumes).
func (k *Kernel) PVolumes() *PVolumes { return (*PVolumes)(k) }

// VolumeMounts is the fake's volume mounts (node.BlockMounts and
// node.BlockFreezer).
func (k *Kernel) VolumeMounts() *VolumeMounts { return (*VolumeMounts)(k) }

// PVolumes fakes the store's persistent volumes.
type PVolumes Kernel

func (p *PVolumes) v() *Volumes { return (*Volumes)(p) }

// Head is the volume's head.
func (p *PVolumes) Head(ctx context.Context, id string) (journal.VolumeHead, error) {
	return p.v().Head(ctx, pvolKey(id))
}

// Publish is the head's compare-and-swap.
func (p *PVolumes) Publish(ctx context.Context, id string, expect, next journal.VolumeHead) (journal.VolumeHead, error) {
	return p.v().Publish(ctx, pvolKey(id), expect, next)
}

// Generations lists the committed generations.
func (p *PVolumes) Generations(ctx context.Context, id string) ([]uint64, error) {
	return p.v().Generations(ctx, pvolKey(id))
}

// DeviceSize is TemplateSize for a committed generation.
func (p *PVolumes) DeviceSize(ctx context.Context, id string, generation uint64) (int64, error) {
	return p.v().DeviceSize(ctx, pvolKey(id), generation)
}

// PutSnapshot names a committed generation.
func (p *PVolumes) PutSnapshot(ctx context.Context, id, name string, generation uint64) error {
	return p.v().PutSnapshot(ctx, pvolKey(id), name, generation)
}

// Snapshots lists the named generations.
func (p *PVolumes) Snapshots(ctx context.Context, id string) ([]blockstore.Snapshot, error) {
	return p.v().Snapshots(ctx, pvolKey(id))
}

// Fork commits dst's generation 0 over src@generation.
func (p *PVolumes) Fork(ctx context.Context, src string, generation uint64, dst string) error {
	return p.v().Fork(ctx, pvolKey(src), generation, pvolKey(dst))
}

// ForkFrom commits dst's generation 0 over src.
func (p *PVolumes) ForkFrom(ctx context.Context, src blockstore.GenRef, dst string) error {
	return p.v().ForkFrom(ctx, src, pvolKey(dst))
}

// VolumeMounts fakes rootfs.Block over the volume mount dir.
type VolumeMounts Kernel

func (m *VolumeMounts) k() *Kernel { return (*Kernel)(m) }

// set is the volumes' mount table.
func (m *VolumeMounts) set() *mountSet {
	k := m.k()
	return &mountSet{k: k, kind: KindVolumeMount, dir: k.VolumeMountDir(), mounts: k.vmounts, verb: "vol"}
}

// Mount mounts a connected device at volume id's mount point.
func (m *VolumeMounts) Mount(ctx context.Context, id, device string) (string, error) {
	return m.set().mount(id, device)
}

// Unmount unmounts volume id and removes its mount point.
func (m *VolumeMounts) Unmount(ctx context.Context, id string) error { return m.set().unmount(id) }

// List names the mount points and mounts.
func (m *VolumeMounts) List(ctx context.Context) ([]string, error) { return m.set().list() }

// Mounted names the mounted volumes.
func (m *VolumeMounts) Mounted(ctx context.Context) ([]string, error) { return m.set().mounted(), nil }

// Superblock is the mounted volume's device.
func (m *VolumeMounts) Superblock(id string) (string, error) { return m.set().superblock(id) }

// CheckGone: not mounted, mount point gone.
func (m *VolumeMounts) CheckGone(ctx context.Context, id, dev string) (bool, string) {
	return m.set().checkGone(id)
}

// Freeze freezes the mounted volume id until thaw.
func (m *VolumeMounts) Freeze(ctx context.Context, id string) (func() error, error) {
	k := m.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.vmounts[id]; !ok {
		return nil, fmt.Errorf("freeze volume %s: not mounted", id)
	}
	k.call("freeze volume %s", id)
	return func() error {
		k.mu.Lock()
		defer k.mu.Unlock()
		k.call("thaw volume %s", id)
		return nil
	}, nil
}

// Thaw is success: the fake keeps no frozen volume across a crash.
func (m *VolumeMounts) Thaw(ctx context.Context, id string) error { return nil }

// SetVolumeHead sets persistent volume id's head as a hostile bucket can
// (SetHead).
func (k *Kernel) SetVolumeHead(id string, h journal.VolumeHead) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.vol(pvolKey(id)).head = h
}
