// Package blockroot is block mode's roots (rootfs.mode = block): the
// writer and block mount entries of the resource table, where a block
// generation starts (its base), and the durable roots (volumes.go:
// seal, pause, snapshot, volume, fork, restore, and the settling of an
// interrupted pause on takeover).
package blockroot

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/op"
	"github.com/ctld/ctld/internal/node/resource"
	"github.com/ctld/ctld/internal/node/writers"
	"github.com/ctld/ctld/internal/proof"
)

// Block mode (rootfs.mode = block): the generation's root is the ext4
// filesystem of a kernel /dev/nbdX served by a writer process of its own
// (internal/writer) over a template's generation 0 in the node's block
// store. Two entries of the resource table: the writer with its device,
// then the device's mount as the OCI root. They are block mode's; the
// overlay's disk quota and mount are overlay mode's: each generation walks
// only the entries of its mode (resource.Table.For), so an overlay generation's
// claim, teardown and proof are what they were before block mode existed.

// Deps are the subsystems of block roots; main builds them
// (node.Deps.Block). A node without Mounts and Templates (and the writers'
// Devices) refuses block claims (unavailable).
type Deps struct {
	Mounts    writers.Mounts // the devices' mounts (*rootfs.Block)
	Templates writers.Templates
	// Volumes and Freezer (and the writers' Sealer) make block roots
	// durable; nil: every block claim starts from its template and pause,
	// snapshot, fork and restore are refused.
	Volumes writers.Volumes
	Freezer writers.Freezer
}

// Wiring is what the node passes block roots: their subsystems, what
// they share with persistent volumes, and what they ask of the node.
type Wiring struct {
	Deps
	writers.Shared
	Epoch uint64
	Ops   *op.Ops
	Locks *op.Locks // the sandboxes' locks
	// Teardown releases a paused generation.
	Teardown Teardowner
}

// Teardowner releases a generation with its cleanup proof (the node's
// teardown): a pause ends its generation so.
type Teardowner interface {
	Teardown(ctx context.Context, rec journal.Sandbox, opID string, final journal.State, reason string) (proof.Proof, error)
}

// Root is the block roots of a node's generations.
type Root struct {
	d Wiring
	// has says the node runs block-mode generations (Devices, Mounts and
	// Templates); durable, that it also seals and resumes them (Volumes,
	// Sealer and Freezer). New decides both once.
	has, durable bool
}

// New is the block roots over d.
func New(d Wiring) *Root {
	has := d.Writers.Devices != nil && d.Mounts != nil && d.Templates != nil
	return &Root{d: d, has: has, durable: has && d.Volumes != nil && d.Writers.Sealer != nil && d.Freezer != nil}
}

// Register adds block mode's entries to b, in claim order: the writer
// with its device, then the device's mount; absent on a node without
// block subsystems. n may be nil where only the entries' specs are read.
func Register(b *resource.Builder[*resource.Claim], n *Root) {
	b.Add(writerResource{n}, n != nil && n.has)
	b.Add(blockMountResource{n}, n != nil && n.has)
}

func (n *Root) live() error          { return n.d.Term.Live() }
func (n *Root) crash(point string)   { n.d.Crash(point) }
func (n *Root) marks() writers.Marks { return writers.Marks{Journal: n.d.Journal, Log: n.d.Log} }

// Has says whether this node can run block-mode generations.
func (n *Root) Has() bool { return n.has }

// Check refuses, before anything is journaled, a block claim this
// node cannot serve: no block subsystems (unavailable), a template its
// block store does not have (not_found), a disk lease other than the
// template's device size (invalid_argument). It fills in the disk lease:
// the device size.
func (n *Root) Check(ctx context.Context, id string, req *journal.ClaimRequest) error {
	if !n.Has() {
		return errdefs.Errorf(errdefs.CodeUnavailable, "rootfs mode %q: this node has no block store and writers configured", journal.RootFSBlock)
	}
	base, _, size, err := n.blockBase(ctx, id, req.RootFS.Template, req.RootFS.ExpectHead)
	if err != nil {
		return err
	}
	switch d := req.Resources.DiskBytes; {
	case d == 0:
		req.Resources.DiskBytes = size
	case d != size:
		return errdefs.Errorf(errdefs.CodeInvalidArgument,
			"resources.disk_bytes %d: a block-mode disk lease is the device size of its base, %d for %s (leave it out)", d, size, base)
	}
	return nil
}

// blockBase is where a new block generation of sandbox id starts: the
// sandbox volume's head when it has one (a resume: its files as last
// paused), else template's generation 0. A head below the volume's
// floor (the node's mark, the claim's expect) is a conflict (headmark.go).
func (n *Root) blockBase(ctx context.Context, id, template string, expect journal.VolumeHead) (blockstore.GenRef, journal.VolumeHead, int64, error) {
	if n.durable {
		h, err := n.d.Volumes.Head(ctx, id)
		if err != nil {
			return blockstore.GenRef{}, journal.VolumeHead{}, 0, errdefs.Errorf(errdefs.CodeUnavailable, "head of sandbox %s's volume: %v", id, err)
		}
		if err := n.marks().Floor(writers.SandboxVolume(id), h, expect); err != nil {
			return blockstore.GenRef{}, journal.VolumeHead{}, 0, err
		}
		if h.Seq > 0 {
			base := blockstore.GenRef{Volume: blockstore.Sandbox(id), Generation: h.Generation}
			size, err := n.d.Volumes.DeviceSize(ctx, id, h.Generation)
			if err != nil {
				return base, journal.VolumeHead{}, 0, errdefs.Errorf(errdefs.CodeUnavailable, "head %s of sandbox %s: %v", base, id, err)
			}
			return base, h, size, nil
		}
	}
	base, size, err := n.d.Templates.Template(ctx, template)
	if err != nil {
		if errdefs.CodeOf(err) == errdefs.CodeNotFound {
			return base, journal.VolumeHead{}, 0, err
		}
		return base, journal.VolumeHead{}, 0, errdefs.Errorf(errdefs.CodeUnavailable, "block template %q: %v", template, err)
	}
	return base, journal.VolumeHead{}, size, nil
}

// baseOf is the generation b's device writes over (records from before
// pause name none: the template's generation 0).
func (n *Root) baseOf(ctx context.Context, b journal.BlockDevice) (blockstore.GenRef, error) {
	if b.BaseVolume == "" {
		base, _, err := n.d.Templates.Template(ctx, b.Template)
		if err != nil {
			return base, fmt.Errorf("template %q: %w", b.Template, err)
		}
		return base, nil
	}
	v, err := blockstore.ParseVolume(b.BaseVolume)
	if err != nil {
		return blockstore.GenRef{}, fmt.Errorf("journaled base: %w", err)
	}
	return blockstore.GenRef{Volume: v, Generation: b.BaseGeneration}, nil
}

// writerDir is the writer dir of rec's generation.
func (n *Root) writerDir(rec journal.Sandbox) string {
	if rec.Block != nil && rec.Block.Dir != "" {
		return rec.Block.Dir
	}
	return filepath.Join(n.d.Config.WritersDir, rec.ContainerID)
}

// putBlock journals rec's writer record (*b) on its sandbox record; also
// runs first in the same transaction and may fill in *b (the epoch).
func (n *Root) putBlock(rec journal.Sandbox, b *journal.BlockDevice, also func(*journal.Tx) error) error {
	return op.PutGeneration(n.d.Journal, rec, also, func(s *journal.Sandbox) {
		cp := *b
		s.Block = &cp
	})
}

// writerResource is the writer process of a block-mode generation and the
// /dev/nbdX it attached.
type writerResource struct{ n *Root }

func (r writerResource) Spec() resource.Spec {
	return resource.Spec{Kind: journal.KindWriter, Phase: resource.PhaseRootFS, Mode: journal.RootFSBlock, Check: "nbd_quiescent", Sweeps: true}
}

// Make takes a new writer epoch and journals it with the writer dir
// BEFORE the writer starts (one transaction), starts the writer, and
// journals what it attached.
func (r writerResource) Make(ctx context.Context, c *resource.Claim) error {
	n := r.n
	rec := c.Rec
	base, head, _, err := n.blockBase(ctx, rec.ID, rec.RootFS.Template, rec.RootFS.ExpectHead)
	if err != nil {
		return fmt.Errorf("start writer: %w", err)
	}
	if head, err = n.fence(ctx, rec, head); err != nil {
		return fmt.Errorf("start writer: %w", err)
	}
	b := journal.BlockDevice{
		Dir: n.writerDir(rec), Template: rec.RootFS.Template, Index: -1,
		BaseVolume: base.Volume.String(), BaseGeneration: base.Generation, Head: head,
	}
	err = n.putBlock(rec, &b, func(tx *journal.Tx) (err error) {
		b.WriterEpoch, err = tx.NextWriterEpoch()
		return err
	})
	if err != nil {
		return fmt.Errorf("journal writer epoch: %w", err)
	}
	c.Rec.Block = &b
	if err := n.live(); err != nil {
		return err
	}
	st, err := n.d.Writers.Devices.Start(ctx, n.d.Config.Spec(rec.ID, rec.Generation, b.WriterEpoch, base, b.Dir))
	if err != nil {
		return fmt.Errorf("start writer: %w", err)
	}
	b.Index, b.PID, b.Size = st.Index, st.PID, st.Size
	if err := n.putBlock(rec, &b, nil); err != nil {
		return fmt.Errorf("journal writer device: %w", err)
	}
	c.Rec.Block, c.Device = &b, st.Device
	return nil
}

// Remove stops the writer (it disconnects its device and waits for the
// kernel to free it) and removes its dir: the generation's dirty data
// goes with it (a release destroys; sealing is part 2's).
func (r writerResource) Remove(ctx context.Context, rec journal.Sandbox) error {
	return r.RemoveOrphan(ctx, r.n.writerDir(rec))
}

func (r writerResource) Gone(ctx context.Context, rec journal.Sandbox) proof.Check {
	dir, index := r.n.writerDir(rec), -1
	if rec.Block != nil {
		index = rec.Block.Index
	}
	ok, d := r.n.d.Writers.Devices.CheckGone(ctx, dir, index)
	if _, err := os.Lstat(dir); err == nil {
		ok, d = false, d+"; writer dir "+dir+" exists"
	} else if !errors.Is(err, fs.ErrNotExist) {
		ok, d = false, d+"; "+err.Error()
	}
	return resource.Check("nbd_quiescent", ok, d)
}

func (r writerResource) List(ctx context.Context) ([]string, error) {
	return r.n.d.Writers.Devices.List(ctx)
}

func (r writerResource) Name(rec journal.Sandbox) string {
	if writers.RootFSMode(rec) != journal.RootFSBlock {
		return ""
	}
	return r.n.writerDir(rec)
}

func (r writerResource) RemoveOrphan(ctx context.Context, dir string) error {
	if err := r.n.d.Writers.Devices.Stop(ctx, dir); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove writer dir: %w", err)
	}
	return nil
}

// missing: a ready generation's writer must run, of its journaled epoch
// (a writer of another epoch is not this generation's).
func (r writerResource) Survey(context.Context) (resource.Missing, error) {
	return func(ctx context.Context, rec journal.Sandbox) string {
		st, err := r.n.d.Writers.Devices.Check(ctx, r.n.writerDir(rec))
		if err != nil || rec.Block == nil || st.Epoch != rec.Block.WriterEpoch {
			return "writer"
		}
		return ""
	}, nil
}

// blockMountResource is the device's filesystem mounted as the OCI root.
type blockMountResource struct{ n *Root }

func (r blockMountResource) Spec() resource.Spec {
	return resource.Spec{Kind: journal.KindBlockMount, Phase: resource.PhaseRootFS, Mode: journal.RootFSBlock, Check: "mounts_gone", Sweeps: true}
}

func (r blockMountResource) Make(ctx context.Context, c *resource.Claim) (err error) {
	n := r.n
	if c.Device == "" {
		return fmt.Errorf("mount block root: generation %d of %s has no attached device", c.Rec.Generation, c.Rec.ID)
	}
	if c.Root, err = n.d.Mounts.Mount(ctx, c.Rec.ContainerID, c.Device); err != nil {
		return fmt.Errorf("mount block root: %w", err)
	}
	// The superblock's device, so the proof checks the filesystem and
	// not only the mount point.
	if dev, err := n.d.Mounts.Superblock(c.Rec.ContainerID); err == nil {
		c.Rec.RootDev = dev
		err := n.d.Journal.Update(func(tx *journal.Tx) error {
			s, ok, err := tx.Sandbox(c.Rec.ID)
			if err != nil || !ok || s.Generation != c.Rec.Generation {
				return err
			}
			s.RootDev = dev
			return tx.PutSandbox(s)
		})
		if err != nil {
			return fmt.Errorf("journal block root device: %w", err)
		}
	}
	return nil
}

func (r blockMountResource) Remove(ctx context.Context, rec journal.Sandbox) error {
	return r.n.d.Mounts.Unmount(ctx, rec.ContainerID)
}

func (r blockMountResource) Gone(ctx context.Context, rec journal.Sandbox) proof.Check {
	ok, d := r.n.d.Mounts.CheckGone(ctx, rec.ContainerID, rec.RootDev)
	return resource.Check("mounts_gone", ok, d)
}

func (r blockMountResource) List(ctx context.Context) ([]string, error) {
	return r.n.d.Mounts.List(ctx)
}

func (blockMountResource) Name(rec journal.Sandbox) string {
	if writers.RootFSMode(rec) != journal.RootFSBlock {
		return ""
	}
	return resource.NameOf(rec)
}

func (r blockMountResource) RemoveOrphan(ctx context.Context, name string) error {
	return r.n.d.Mounts.Unmount(ctx, name)
}

func (r blockMountResource) Survey(ctx context.Context) (resource.Missing, error) {
	mounted, err := r.n.d.Mounts.Mounted(ctx)
	if err != nil {
		return nil, fmt.Errorf("list block root mounts: %w", err)
	}
	return resource.MissingUnless(resource.SetOf(mounted), resource.NameOf, "rootfs mount"), nil
}

// Identify fills in the device of a writer whose start the journal
// saw intended but not done (a crash between the two): its state file
// says which /dev/nbdX it attached, which the proof must check once the
// writer is stopped (its state goes with it).
func (n *Root) Identify(ctx context.Context, rec journal.Sandbox) (journal.Sandbox, bool) {
	if rec.Block == nil || rec.Block.Index >= 0 || !n.has {
		return rec, false
	}
	st, err := n.d.Writers.Devices.Check(ctx, rec.Block.Dir)
	if err != nil || st.Epoch != rec.Block.WriterEpoch {
		return rec, false
	}
	b := *rec.Block
	b.Index, b.PID, b.Size = st.Index, st.PID, st.Size
	rec.Block = &b
	return rec, true
}
