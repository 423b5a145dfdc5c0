package rootfs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/ctld/ctld/internal/diskquota"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/names"
)

// A sandbox's scratch dir (overlay upper and work, so everything the guest
// writes) is bounded by a project quota on the scratch filesystem: the dir
// gets the generation's project id with PROJINHERIT before upper/ and
// work/ are made in it, and the project a hard block and inode limit. The
// kernel refuses a write past the limit with ENOSPC (XFS, even for root),
// so a guest cannot fill the filesystem that holds the journal.

// Waiting for a removed tree's usage to reach zero: XFS frees unlinked
// inodes in a background worker, so usage drops a moment after rm.
const (
	quotaSettleTries = 100
	quotaSettleDelay = 50 * time.Millisecond
)

// DiskInodes is the inode limit that goes with a byte limit: one inode per
// 4 KiB leased, at least 1024. Inodes are charged apart from blocks, so
// without it a guest could fill the filesystem with empty files.
func DiskInodes(bytes int64) uint64 { return uint64(max(bytes/4096, 1024)) }

// DiskBounded says whether the scratch filesystem enforces project quotas;
// if not, the error says what it is and what to fix (fail closed: a disk
// lease is never silently unbounded).
func (o *Overlay) DiskBounded() error {
	if err := os.MkdirAll(o.ScratchDir, 0o700); err != nil {
		return fmt.Errorf("make scratch dir: %w", err)
	}
	st, err := diskquota.Probe(o.ScratchDir)
	if err != nil {
		return fmt.Errorf("probe disk quota of scratch dir %s: %w", o.ScratchDir, err)
	}
	if !st.Bounded() {
		return errdefs.Errorf(errdefs.CodeUnavailable, "disk lease cannot be enforced: scratch dir %s: %s; put it on XFS mounted with prjquota; see `ctld doctor`", o.ScratchDir, st.Detail)
	}
	return nil
}

// LimitDisk makes sandbox id's scratch dir, gives it project and limits the
// project to bytes (and DiskInodes(bytes)), read back. It is idempotent for
// the same project. A project that already holds usage or a limit and is
// not this dir's is refused: someone else uses it.
func (o *Overlay) LimitDisk(ctx context.Context, id string, project uint32, bytes int64) error {
	if err := names.CheckID("sandbox id", id); err != nil {
		return err
	}
	if project == 0 || bytes <= 0 {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "disk limit of %s: project %d, %d bytes: both must be positive", id, project, bytes)
	}
	if err := o.DiskBounded(); err != nil {
		return err
	}
	dir := o.Dir(id)
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("make dir %s: %w", dir, err)
	}
	have, inherit, err := diskquota.Project(dir)
	if err != nil {
		return err
	}
	if have != project || !inherit {
		q, err := diskquota.Get(o.ScratchDir, project)
		if err != nil {
			return err
		}
		if !q.Empty() {
			return errdefs.Errorf(errdefs.CodeConflict, "project id %d is already in use on the scratch filesystem (%d bytes in %d inodes, limit %d bytes): another node or tool uses ctld's project range", project, q.UsedBytes, q.UsedInodes, q.LimitBytes)
		}
		if err := diskquota.SetProject(dir, project); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("limit disk: %w", err)
	}
	inodes := DiskInodes(bytes)
	if err := diskquota.SetLimit(o.ScratchDir, project, uint64(bytes), inodes); err != nil {
		return err
	}
	q, err := diskquota.Get(o.ScratchDir, project)
	if err != nil {
		return err
	}
	want := (uint64(bytes) + 1023) / 1024 * 1024
	if q.LimitBytes != want || q.LimitInodes != inodes {
		return fmt.Errorf("disk limit of project %d reads back as %d bytes, %d inodes; wrote %d, %d", project, q.LimitBytes, q.LimitInodes, want, inodes)
	}
	o.logger().Info("disk limited", "sandbox", id, "project", project, "bytes", bytes, "inodes", inodes)
	return nil
}

// RemoveScratch removes sandbox id's scratch dir if it is empty: what
// LimitDisk made before an overlay was mounted in it. Absent is success.
// A dir with content (an overlay's dirs) is Unmount's to remove, so it is
// refused rather than walked.
func (o *Overlay) RemoveScratch(id string) error {
	if err := names.CheckID("sandbox id", id); err != nil {
		return err
	}
	dir := o.Dir(id)
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove scratch dir %s: %w", dir, err)
	}
	return nil
}

// UnlimitDisk clears project's limits once nothing is charged to it any
// more (the scratch dir is removed first, by Unmount). While the project
// still holds data its limit stays, so leftovers stay bounded. Already
// clear is success.
func (o *Overlay) UnlimitDisk(ctx context.Context, project uint32) error {
	if project == 0 {
		return nil
	}
	var q diskquota.Quota
	var err error
	for i := 0; ; i++ {
		if q, err = diskquota.Get(o.ScratchDir, project); err != nil {
			return err
		}
		if q.UsedBytes == 0 && q.UsedInodes == 0 {
			break
		}
		if i == quotaSettleTries {
			return fmt.Errorf("project %d still holds %d bytes in %d inodes; keeping its disk limit", project, q.UsedBytes, q.UsedInodes)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("unlimit disk of project %d: %w", project, ctx.Err())
		case <-time.After(quotaSettleDelay):
		}
	}
	if q.Empty() {
		return nil
	}
	if err := diskquota.SetLimit(o.ScratchDir, project, 0, 0); err != nil {
		return err
	}
	o.logger().Info("disk limit cleared", "project", project)
	return nil
}

// CheckDiskGone is the disk part of the cleanup proof: the project holds
// no limit and no usage on the scratch filesystem.
func (o *Overlay) CheckDiskGone(ctx context.Context, project uint32) (ok bool, detail string) {
	if project == 0 {
		return true, "no disk lease"
	}
	q, err := diskquota.Get(o.ScratchDir, project)
	if err != nil {
		return false, fmt.Sprintf("cannot read project %d: %v", project, err)
	}
	if !q.Empty() {
		return false, fmt.Sprintf("project %d still has limit %d bytes/%d inodes and uses %d bytes in %d inodes", project, q.LimitBytes, q.LimitInodes, q.UsedBytes, q.UsedInodes)
	}
	return true, fmt.Sprintf("project %d: no limit, no usage", project)
}

// DiskProjects lists the projects in [from, to) that hold a limit or usage
// on the scratch filesystem, for the reconciler.
func (o *Overlay) DiskProjects(ctx context.Context, from, to uint32) ([]diskquota.Quota, error) {
	if _, err := os.Stat(o.ScratchDir); errors.Is(err, fs.ErrNotExist) {
		return nil, nil // no scratch filesystem yet: no sandbox ever had a dir there
	}
	if st, err := diskquota.Probe(o.ScratchDir); err != nil || !st.Accounting {
		return nil, err // nothing can hold a project where none is accounted
	}
	return diskquota.List(o.ScratchDir, from, to)
}
