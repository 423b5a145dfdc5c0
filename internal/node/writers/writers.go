// Package writers is what block roots (internal/node/blockroot) and
// persistent volumes (internal/node/pvolume) share: the writers' config
// and the spec of a writer, the block subsystems the node drives (as it
// uses them), the volumes' head marks (headmark.go), and the watch that
// restarts a dead writer on its device (watch.go).
package writers

import (
	"context"
	"log/slog"
	"time"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/blockstore/storecfg"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/op"
	"github.com/ctld/ctld/internal/rootfs"
	"github.com/ctld/ctld/internal/writer"
)

// Config configures block-mode generations and persistent volumes.
type Config struct {
	// WritersDir holds one writer dir per generation (the Supervisor's
	// Root): dirty file, index, chunk cache, lock, state.
	WritersDir string
	// StoreDir is the block store (dirstore); NodeKeyFile and NodeKeyID
	// the node key that unwraps its data keys (read by each writer).
	StoreDir string
	// Store, when its Location is set, names the block store instead of
	// StoreDir (a directory or an S3 bucket; no secret in it).
	Store       storecfg.Config
	NodeKeyFile string
	NodeKeyID   string
	// BaseCache is the node's base cache directory, handed to every
	// writer (writer.Spec.BaseCache); empty for none.
	BaseCache string
	// DeadConnTimeout is how long the kernel holds a device's I/O for a
	// reconnect after its writer's socket died: a dead writer is
	// restarted within it (watch.go).
	DeadConnTimeout time.Duration
	// RequestTimeout is the kernel's per-request timeout (0: the
	// writer's default). A request in flight when a writer died is
	// retried on the restarted writer's socket only after it.
	RequestTimeout time.Duration
	// CheckEvery is how often the primary checks that each ready block
	// generation's writer runs (0: DefaultCheck).
	CheckEvery time.Duration
	// RestartAttempts bounds the restarts of one dead writer before its
	// generation is lost (0: DefaultRestarts).
	RestartAttempts int
}

// Spec is the spec of a writer of generation gen of sandbox with epoch
// over base in dir, with the store, key, cache and timeouts of c; a new
// writer attaches a free device (Index -1).
func (c Config) Spec(sandbox string, gen, epoch uint64, base blockstore.GenRef, dir string) writer.Spec {
	return writer.Spec{
		Sandbox: sandbox, Generation: gen, Epoch: epoch,
		StoreDir: c.StoreDir, Store: c.Store, NodeKeyFile: c.NodeKeyFile, NodeKeyID: c.NodeKeyID, BaseCache: c.BaseCache,
		Base: base, Dir: dir, Index: -1,
		DeadConnTimeout: c.DeadConnTimeout, RequestTimeout: c.RequestTimeout,
	}
}

// RootFSMode is rec's RootFS mode (records from before modes: overlay).
func RootFSMode(rec journal.Sandbox) journal.RootFSMode {
	if rec.RootFS.Mode == "" {
		return journal.RootFSOverlay
	}
	return rec.RootFS.Mode
}

// Deps are the subsystems block roots and persistent volumes share; main
// builds them (node.Deps.Writers).
type Deps struct {
	Devices Devices // *writer.Supervisor
	// Sealer seals a writer's device into a new generation in the store
	// (block roots' pause and snapshot, a volume's detach).
	Sealer Sealer
}

// Shared is what the node passes block roots and persistent volumes
// alike: the writers' subsystems and config, the journal, the node's id,
// its term and crash hook (op.Runner.Crash), and the log.
type Shared struct {
	Writers Deps
	Config  Config
	Journal *journal.Journal
	NodeID  string
	Term    *op.Term
	Crash   func(point string)
	Log     *slog.Logger
}

// Block mode (rootfs.mode = block, DESIGN.md "RootFS"). Each interface is
// one resource kind of a block-mode generation; a node without them
// refuses block claims (unavailable).

// Devices runs the writer processes of block-mode generations: each
// serves a copy-on-write device over a template's generation on a kernel
// /dev/nbdX, outlives the primary, and is adopted by the next one
// (writer.Supervisor; its doc comments define the semantics).
type Devices interface {
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

var _ Devices = (*writer.Supervisor)(nil)

// Mounts mounts the filesystem of a block-mode generation's device as
// its OCI root.
type Mounts interface {
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

var _ Mounts = (*rootfs.Block)(nil)

// Templates are the templates of the node's block store.
type Templates interface {
	// Template returns the generation a device over template name writes
	// over and its device size; a template the store does not have is
	// errdefs not_found.
	Template(ctx context.Context, name string) (base blockstore.GenRef, size int64, err error)
}

// Volumes is the block store's side of durable sandboxes (issue 10):
// each block-mode sandbox has a volume of committed generations with a
// published head. A node without it keeps no head: every block claim
// starts from its template and pause, snapshot, fork and restore are
// refused.
type Volumes interface {
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
	// ForkFrom commits dst's generation 0 over src, a generation of any
	// volume (a template's), copying nothing; conflict as Fork.
	ForkFrom(ctx context.Context, src blockstore.GenRef, dst string) error
}

// Sealer seals a running writer's device (writer.Supervisor.Seal): it
// commits the device's dirty chunks as generation of the sandbox volume
// over the device's base, and rebases the device onto it. epoch must be
// the writer's (a stale caller is refused).
type Sealer interface {
	Seal(ctx context.Context, dir string, generation, epoch uint64) (journal.SealResult, error)
}

// Freezer freezes a mounted block root (FIFREEZE): the filesystem's
// dirty data reaches the device and new writes wait until thaw.
type Freezer interface {
	Freeze(ctx context.Context, id string) (thaw func() error, err error)
	// Thaw thaws id's root if frozen (a primary died between a freeze
	// and its thaw); not frozen or not mounted is success.
	Thaw(ctx context.Context, id string) error
}

var _ Freezer = (*rootfs.Block)(nil)
