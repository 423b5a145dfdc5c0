package overlay

import (
	"context"
	"fmt"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
)

// The disk lease of a generation: resources.disk_bytes (or the node's
// default) is counted by the ledger like CPU and memory, and enforced by a
// project quota on the scratch dir (rootfs/disk.go). The project id is
// allocated in the claim's journal transaction and kept in the sandbox
// record, so teardown, the cleanup proof and the reconciler find it after
// a crash even when the scratch dir is gone.

// DiskProjects is the range of project ids ctld owns on the scratch
// filesystem: [Base, Base+Count).
type DiskProjects struct {
	Base, Count uint32
}

// DefaultDiskProjects leaves the low ids to the operator's own projects.
var DefaultDiskProjects = DiskProjects{Base: 1 << 24, Count: 1 << 20}

// WithDiskDefault fills in the node's default disk lease.
func (o *Overlay) WithDiskDefault(r journal.Resources) journal.Resources {
	if r.DiskBytes == 0 {
		r.DiskBytes = o.cfg.DefaultDiskBytes
	}
	return r
}

// CheckDisk refuses, before anything is journaled, a claim whose disk
// lease this node cannot enforce.
func (o *Overlay) CheckDisk(r journal.Resources) error {
	if r.DiskBytes <= 0 {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "resources.disk_bytes is required: this node has no default disk lease")
	}
	return o.fs.DiskBounded()
}

// AllocDiskProject picks the lowest project id of the node's range that no
// generation holding capacity (live, half done or withheld) uses. It runs
// inside the claim's write transaction, so two claims never pick the same.
func (o *Overlay) AllocDiskProject(all []journal.Sandbox) (uint32, error) {
	pr := o.diskProjects()
	used := map[uint32]bool{}
	for _, s := range all {
		if s.DiskProject != 0 && (s.Holds() || s.Withheld) {
			used[s.DiskProject] = true
		}
	}
	for id := pr.Base; id-pr.Base < pr.Count; id++ {
		if !used[id] {
			return id, nil
		}
	}
	return 0, errdefs.Errorf(errdefs.CodeCapacityExhausted, "no free disk project id in [%d, %d)", pr.Base, pr.Base+pr.Count)
}

// diskProjects is the node's project id range.
func (o *Overlay) diskProjects() DiskProjects {
	if o.cfg.DiskProjects.Count == 0 {
		return DefaultDiskProjects
	}
	return o.cfg.DiskProjects
}

// Relimit sets rec's disk quota to its resources' disk lease on the
// scratch dir its project bounds already: a warm member's, taken by a
// claim with another disk lease.
func (o *Overlay) Relimit(ctx context.Context, rec journal.Sandbox) error {
	if o == nil || o.fs == nil {
		return errdefs.Errorf(errdefs.CodeUnavailable, "disk: not configured on this node")
	}
	if err := o.fs.LimitDisk(ctx, rec.ContainerID, rec.DiskProject, rec.Resources.DiskBytes); err != nil {
		return fmt.Errorf("set the disk quota: %w", err)
	}
	return nil
}
