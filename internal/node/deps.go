package node

import (
	"context"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/rootfs"
	"github.com/ctld/ctld/internal/writer"
)

// The block-mode subsystems the node drives, as the node uses them:
// exactly the methods it calls, so a fake kernel (node/fakekernel) can
// stand in for them in unit tests (the guest's, the overlay's and the
// network's interfaces live in their concern packages). Their doc comments
// define the semantics (idempotent removal, CheckGone, List by ctld name)
// a fake must keep.

// Block mode (rootfs.mode = block, DESIGN.md "RootFS"). Each interface is
// one resource kind of a block-mode generation; a node without them
// refuses block claims (unavailable).

// BlockDevices runs the writer processes of block-mode generations: each
// serves a copy-on-write device over a template's generation on a kernel
// /dev/nbdX, outlives the primary, and is adopted by the next one
// (writer.Supervisor; its doc comments define the semantics).
type BlockDevices interface {
	// Start starts the writer of spec.Dir and returns once its device is
	// attached; a live writer for that Dir is refused (writer.ErrBusy).
	Start(ctx context.Context, spec writer.Spec) (writer.State, error)
	// Stop ends the Dir's writer and disconnects its device; no writer is
	// success.
	Stop(ctx context.Context, dir string) error
	// Check returns the live writer's State, else writer.ErrNotRunning.
	Check(ctx context.Context, dir string) (writer.State, error)
	// CheckGone is the proof check: no writer for dir and /dev/nbd<index>
	// quiescent (index < 0: none was attached).
	CheckGone(ctx context.Context, dir string, index int) (ok bool, detail string)
	// List names the writer dirs (full paths) with a writer or its state.
	List(ctx context.Context) ([]string, error)
}

var _ BlockDevices = (*writer.Supervisor)(nil)

// BlockMounts mounts the filesystem of a block-mode generation's device
// as its OCI root.
type BlockMounts interface {
	// Mount mounts device (ext4) at the generation's root mount point and
	// returns it; the same device already mounted there is success.
	Mount(ctx context.Context, id, device string) (root string, err error)
	// Unmount unmounts it and removes the mount point; absent is success.
	Unmount(ctx context.Context, id string) error
	// List names the generations with a mount point or a mount.
	List(ctx context.Context) ([]string, error)
	// Mounted names the generations whose root is mounted (one read).
	Mounted(ctx context.Context) ([]string, error)
	// Superblock is the mounted filesystem's device (major:minor).
	Superblock(id string) (string, error)
	CheckGone(ctx context.Context, id, dev string) (ok bool, detail string)
}

var _ BlockMounts = (*rootfs.Block)(nil)

// BlockTemplates are the templates of the node's block store.
type BlockTemplates interface {
	// Template returns the generation a device over template name writes
	// over and its device size; a template the store does not have is
	// errdefs not_found.
	Template(ctx context.Context, name string) (base blockstore.GenRef, size int64, err error)
}

// BlockVolumes is the block store's side of durable sandboxes (issue 10):
// each block-mode sandbox has a volume of committed generations with a
// published head. A node without it keeps no head: every block claim
// starts from its template and pause, snapshot, fork and restore are
// refused.
type BlockVolumes interface {
	// Head is the sandbox volume's head (Seq 0: none).
	Head(ctx context.Context, sandbox string) (journal.VolumeHead, error)
	// Publish makes next the head iff the head is expect and next's
	// writer epoch is not older than the head's: else errdefs fenced.
	Publish(ctx context.Context, sandbox string, expect, next journal.VolumeHead) (journal.VolumeHead, error)
	// Generations lists the volume's committed generations, ascending.
	Generations(ctx context.Context, sandbox string) ([]uint64, error)
	// DeviceSize is the device size of a committed generation.
	DeviceSize(ctx context.Context, sandbox string, generation uint64) (int64, error)
	// PutSnapshot names a committed generation (a taken name: conflict).
	PutSnapshot(ctx context.Context, sandbox, name string, generation uint64) error
	Snapshots(ctx context.Context, sandbox string) ([]blockstore.Snapshot, error)
	// Fork commits dst's generation 0 over src@generation, copying
	// nothing (a volume that has generations: conflict).
	Fork(ctx context.Context, src string, generation uint64, dst string) error
}

// BlockSealer seals a running writer's device (writer.Supervisor.Seal):
// it commits the device's dirty chunks as generation of the sandbox
// volume over the device's base, and rebases the device onto it. epoch
// must be the writer's (a stale caller is refused).
type BlockSealer interface {
	Seal(ctx context.Context, dir string, generation, epoch uint64) (journal.SealResult, error)
}

// BlockFreezer freezes a mounted block root (FIFREEZE): the filesystem's
// dirty data reaches the device and new writes wait until thaw.
type BlockFreezer interface {
	Freeze(ctx context.Context, id string) (thaw func() error, err error)
	// Thaw thaws id's root if frozen (a primary died between a freeze
	// and its thaw); not frozen or not mounted is success.
	Thaw(ctx context.Context, id string) error
}

var _ BlockFreezer = (*rootfs.Block)(nil)
