package node

import (
	"context"
	"io"
	"syscall"

	"github.com/ctld/ctld/internal/diskquota"
	"github.com/ctld/ctld/internal/netpolicy"
	"github.com/ctld/ctld/internal/node/lease"
	"github.com/ctld/ctld/internal/rootfs"
	"github.com/ctld/ctld/internal/runsc"
)

// The real subsystems are what the interfaces below describe.
var (
	_ Leases  = (*lease.Manager)(nil)
	_ RootFS  = (*rootfs.Overlay)(nil)
	_ Netns   = (*netpolicy.Netns)(nil)
	_ Runtime = (*runsc.Runtime)(nil)
)

// The kernel subsystems the node drives, as the node uses them: exactly
// the methods it calls, so a fake kernel (node/fakekernel) can stand in
// for them in unit tests. main passes the real ones (*lease.Manager,
// *rootfs.Overlay, *netpolicy.Netns, *runsc.Runtime); their doc comments
// define the semantics (idempotent removal, CheckGone, List by ctld name)
// a fake must keep.

// Leases makes and removes the cgroup leases of generations.
type Leases interface {
	Create(ctx context.Context, s lease.Spec) error
	Remove(ctx context.Context, id string) error
	Kill(ctx context.Context, id string) error
	Populated(ctx context.Context, id string) (bool, error)
	List(ctx context.Context) ([]string, error)
	Stats(ctx context.Context, id string) (lease.Stats, error)
	CheckGone(ctx context.Context, id string) (ok bool, detail string)
	Dir(id string) string
	CgroupsPath(id string) string
}

// RootFS makes the root filesystems of generations and their disk leases.
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

// Netns makes and removes the network namespaces of generations.
type Netns interface {
	Create(ctx context.Context, name string) (path string, err error)
	Delete(ctx context.Context, name string) error
	List(ctx context.Context) ([]string, error)
	Mounted(ctx context.Context) ([]string, error)
	Path(name string) string
	Identify(ctx context.Context, name string) (netpolicy.NSID, error)
	CheckGone(ctx context.Context, name string, id netpolicy.NSID) (ok bool, detail string)
}

// Runtime runs the generations' guests (runsc containers).
type Runtime interface {
	Create(ctx context.Context, id, bundleDir string) error
	Start(ctx context.Context, id string) error
	Exec(ctx context.Context, id string, p runsc.ExecProcess, stdin io.Reader, stdout, stderr io.Writer) (int, error)
	Kill(ctx context.Context, id string, sig syscall.Signal, all bool) error
	Delete(ctx context.Context, id string) error
	Known() ([]string, error)
	CheckGone(ctx context.Context, id string) (ok bool, detail string)
	LogRoot() string
	ContainerLogDir(id string) string
}
