// Package overlay is the node's overlay root concern (issue 26): the
// entries of an overlay-mode generation's disk quota and overlay mount,
// and the disk lease's project ids, default and check. The node registers
// the entries and asks it at admission.
package overlay

import (
	"context"

	"github.com/ctld/ctld/internal/diskquota"
	"github.com/ctld/ctld/internal/node/resource"
	"github.com/ctld/ctld/internal/rootfs"
)

var _ RootFS = (*rootfs.Overlay)(nil)

// RootFS makes the root filesystems of generations and their disk leases
// (*rootfs.Overlay; node/fakekernel's RootFS in unit tests).
type RootFS interface {
	Mount(ctx context.Context, id, lower string) (root string, err error)
	Unmount(ctx context.Context, id string) error
	List(ctx context.Context) ([]string, error)
	Mounted(ctx context.Context) ([]string, error)
	Superblock(id string) (string, error)
	CheckGone(ctx context.Context, id, dev string) (ok bool, detail string)
	DiskBounded() error
	LimitDisk(ctx context.Context, id string, project uint32, bytes int64) error
	RemoveScratch(id string) error
	UnlimitDisk(ctx context.Context, project uint32) error
	CheckDiskGone(ctx context.Context, project uint32) (ok bool, detail string)
	DiskProjects(ctx context.Context, from, to uint32) ([]diskquota.Quota, error)
}

// Config is the overlay concern's part of the node's configuration (see
// node.Config).
type Config struct {
	// DefaultDiskBytes is the disk lease of a claim that names none.
	DefaultDiskBytes int64
	// DiskProjects is the project id range ctld owns on the scratch
	// filesystem (zero: DefaultDiskProjects).
	DiskProjects DiskProjects
}

// Deps are the subsystems the overlay concern drives; main builds them
// (node.Deps.Overlay).
type Deps struct {
	RootFS RootFS // *rootfs.Overlay
}

// Overlay is the node's overlay root concern.
type Overlay struct {
	cfg Config
	fs  RootFS
}

// New is the overlay concern over d.
func New(cfg Config, d Deps) *Overlay { return &Overlay{cfg: cfg, fs: d.RootFS} }

// Register adds the overlay concern's entries to b in claim order: the
// disk quota before the overlay mount (the quota bounds the scratch dir
// before the upper is used). They are absent without a RootFS; o may be
// nil where only the entries' specs are read.
func Register(b *resource.Builder[*resource.Claim], o *Overlay) {
	present := o != nil && o.fs != nil
	b.Add(diskResource{o}, present)
	b.Add(mountResource{o}, present)
}
