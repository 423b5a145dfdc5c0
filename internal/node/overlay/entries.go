package overlay

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/resource"
	"github.com/ctld/ctld/internal/proof"
	"github.com/ctld/ctld/internal/templatelock"
)

// diskResource is the project quota that bounds the scratch dir. Its name
// is the project id, allocated in the claim's journal transaction.
type diskResource struct {
	o *Overlay
}

func (diskResource) Spec() resource.Spec {
	return resource.Spec{Kind: journal.KindDisk, Phase: resource.PhaseRootFS, Mode: journal.RootFSOverlay, Check: "disk_quota_cleared", Sweeps: true}
}
func (r diskResource) Make(ctx context.Context, c *resource.Claim) error {
	rec := c.Rec
	if rec.DiskProject == 0 {
		return fmt.Errorf("limit disk: generation %d of %s has no disk project", rec.Generation, rec.ID)
	}
	if err := r.o.fs.LimitDisk(ctx, rec.ContainerID, rec.DiskProject, rec.Resources.DiskBytes); err != nil {
		return fmt.Errorf("limit disk: %w", err)
	}
	return nil
}

// Remove removes the scratch dir the claim step made (once the overlay in
// it is gone, the mount entry's removal took it already), then the quota:
// the project's limit is cleared only once nothing is charged to it.
func (r diskResource) Remove(ctx context.Context, rec journal.Sandbox) error {
	if err := r.o.fs.RemoveScratch(rec.ContainerID); err != nil {
		return err
	}
	if rec.DiskProject == 0 {
		return nil // a record from before disk leases: the sweep covers ctld's range
	}
	return r.o.fs.UnlimitDisk(ctx, rec.DiskProject)
}
func (r diskResource) Gone(ctx context.Context, rec journal.Sandbox) proof.Check {
	ok, d := r.o.fs.CheckDiskGone(ctx, rec.DiskProject)
	return resource.Check("disk_quota_cleared", ok, d)
}

// List lists the projects of ctld's range that have a quota.
func (r diskResource) List(ctx context.Context) ([]string, error) {
	pr := r.o.diskProjects()
	qs, err := r.o.fs.DiskProjects(ctx, pr.Base, pr.Base+pr.Count)
	var out []string
	for _, q := range qs {
		out = append(out, strconv.FormatUint(uint64(q.ID), 10))
	}
	return out, err
}
func (diskResource) Name(rec journal.Sandbox) string {
	if rec.DiskProject == 0 {
		return ""
	}
	return strconv.FormatUint(uint64(rec.DiskProject), 10)
}
func (r diskResource) RemoveOrphan(ctx context.Context, name string) error {
	id, err := strconv.ParseUint(name, 10, 32)
	if err != nil {
		return fmt.Errorf("disk project %q: %w", name, err)
	}
	return r.o.fs.UnlimitDisk(ctx, uint32(id))
}

type mountResource struct{ o *Overlay }

func (mountResource) Spec() resource.Spec {
	return resource.Spec{Kind: journal.KindMount, Phase: resource.PhaseRootFS, Mode: journal.RootFSOverlay, Check: "mounts_gone", Sweeps: true}
}
func (r mountResource) Make(ctx context.Context, c *resource.Claim) (err error) {
	// Shared with `template rm` (templatelock): the tree is not removed
	// while the overlay over it is being made.
	if !filepath.IsAbs(c.Lower) {
		return fmt.Errorf("mount rootfs: template dir %q is not absolute", c.Lower)
	}
	unlock, err := templatelock.Shared(ctx, filepath.Dir(c.Lower))
	if err != nil {
		return fmt.Errorf("mount rootfs: %w", err)
	}
	defer unlock()
	if c.Root, err = r.o.fs.Mount(ctx, c.Rec.ContainerID, c.Lower); err != nil {
		return fmt.Errorf("mount rootfs: %w", err)
	}
	return nil
}
func (r mountResource) Remove(ctx context.Context, rec journal.Sandbox) error {
	return r.o.fs.Unmount(ctx, rec.ContainerID)
}
func (r mountResource) Gone(ctx context.Context, rec journal.Sandbox) proof.Check {
	ok, d := r.o.fs.CheckGone(ctx, rec.ContainerID, rec.RootDev)
	return resource.Check("mounts_gone", ok, d)
}
func (r mountResource) List(ctx context.Context) ([]string, error) {
	return r.o.fs.List(ctx)
}
func (mountResource) Name(rec journal.Sandbox) string { return resource.NameOf(rec) }
func (r mountResource) RemoveOrphan(ctx context.Context, name string) error {
	return r.o.fs.Unmount(ctx, name)
}
func (r mountResource) Survey(ctx context.Context) (resource.Missing, error) {
	mounts, err := r.o.fs.Mounted(ctx)
	if err != nil {
		return nil, fmt.Errorf("list rootfs mounts: %w", err)
	}
	return resource.MissingUnless(resource.SetOf(mounts), resource.NameOf, "rootfs mount"), nil
}
