package node

import (
	"context"
	"errors"
	"fmt"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/node/journal"
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

// withDiskDefault fills in the node's default disk lease.
func (n *Node) withDiskDefault(r api.Resources) api.Resources {
	if r.DiskBytes == 0 {
		r.DiskBytes = n.cfg.DefaultDiskBytes
	}
	return r
}

// checkDisk refuses, before anything is journaled, a claim whose disk
// lease this node cannot enforce.
func (n *Node) checkDisk(r api.Resources) error {
	if r.DiskBytes <= 0 {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "resources.disk_bytes is required: this node has no default disk lease")
	}
	return n.d.RootFS.DiskBounded()
}

// allocDiskProject picks the lowest project id of the node's range that no
// generation holding capacity (live, half done or withheld) uses. It runs
// inside the claim's write transaction, so two claims never pick the same.
func (n *Node) allocDiskProject(all []journal.Sandbox) (uint32, error) {
	pr := n.cfg.DiskProjects
	if pr.Count == 0 {
		pr = DefaultDiskProjects
	}
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

// limitDisk is the claim step: journaled, then the project quota is set on
// the sandbox's scratch dir before the overlay is mounted over it.
func (n *Node) limitDisk(ctx context.Context, rec journal.Sandbox) error {
	if rec.DiskProject == 0 {
		return fmt.Errorf("generation %d of %s has no disk project", rec.Generation, rec.ID)
	}
	return n.effect(journal.KindDisk, rec.ContainerID, rec, func() error {
		return n.d.RootFS.LimitDisk(ctx, rec.ContainerID, rec.DiskProject, rec.Resources.DiskBytes)
	})
}

// sweepDiskProjects clears project quotas of ctld's range that no
// generation in the journal holds (a crash between a claim's quota and its
// journal record cannot leave one, but an operator's restore or a foreign
// tool can). A project that still holds data keeps its limit.
func (n *Node) sweepDiskProjects(ctx context.Context) error {
	pr := n.cfg.DiskProjects
	if pr.Count == 0 {
		pr = DefaultDiskProjects
	}
	var ss []journal.Sandbox
	if err := n.d.Journal.View(func(tx *journal.Tx) (err error) {
		ss, err = tx.LiveSandboxes()
		return err
	}); err != nil {
		return fmt.Errorf("read journal: %w", err)
	}
	owned := map[uint32]bool{}
	for _, s := range ss {
		if s.DiskProject != 0 && (s.Holds() || s.Withheld) {
			owned[s.DiskProject] = true
		}
	}
	qs, err := n.d.RootFS.DiskProjects(ctx, pr.Base, pr.Base+pr.Count)
	if err != nil {
		return fmt.Errorf("list disk projects: %w", err)
	}
	var errs []error
	for _, q := range qs {
		if owned[q.ID] {
			continue
		}
		n.log.Warn("removing orphan", "kind", journal.KindDisk, "project", q.ID, "used_bytes", q.UsedBytes, "limit_bytes", q.LimitBytes)
		if err := n.d.RootFS.UnlimitDisk(ctx, q.ID); err != nil {
			errs = append(errs, fmt.Errorf("remove orphan disk project %d: %w", q.ID, err))
		}
	}
	return errors.Join(errs...)
}
