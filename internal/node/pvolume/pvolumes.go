// Package pvolume is the persistent volumes of generations (issue 10
// item 6): the volumes entry of the resource table, and the claim's
// checks of the volumes it names.
package pvolume

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/names"
	"github.com/ctld/ctld/internal/node/op"
	"github.com/ctld/ctld/internal/node/resource"
	"github.com/ctld/ctld/internal/node/writers"
	"github.com/ctld/ctld/internal/proof"
	"github.com/ctld/ctld/internal/runsc"
	"github.com/ctld/ctld/internal/writer"
)

// Persistent volumes (issue 10 item 6): a block-store volume of its own
// (blockstore.KindVolume) attached to one generation at a time, in either
// RootFS mode. Per volume the claim takes a writer epoch (journaled before
// the writer starts), starts a writer over the volume's head (its dir
// <writers>/vol/<container>/<volume>), mounts the device's ext4 on the
// host (VolumeMounts, keyed by volume id) and binds the mount into the OCI
// spec at the volume's path. The teardown, after the guest is gone, seals
// the device (freeze, seal, thaw) and publishes it as the volume's head
// over the head the attach started from, then unmounts and stops the
// writer: the volume's data outlives the sandbox. A publish that loses
// its compare-and-swap (another writer moved the head, or the volume was
// deleted) is journaled on the attach and reported in the proof's check,
// never dropped silently; a seal or publish that fails for any other
// reason fails the teardown (withheld, retried), the writer and its dirty
// data kept.
//
// One entry of the resource table for all of a generation's volumes: its
// object is the generation's dir <writers>/vol/<container>, which holds
// one writer dir per volume and is removed last, so a teardown (or the
// orphan sweep) finds every volume of a generation from its container id.

// Deps are the subsystems of persistent volumes; main builds them
// (node.Deps.Volumes): the store's volumes of kind volumes, and the host
// mounts of their devices (a mount dir of their own, keyed by volume id:
// a volume is attached to one generation at a time). Without them (or
// the writers') claims naming volumes are refused.
type Deps struct {
	Store   writers.Volumes
	Mounts  writers.Mounts // *rootfs.Block
	Freezer writers.Freezer
}

// Wiring is what the node passes the persistent volumes: their
// subsystems, what they share with block roots, and what they ask of the
// node.
type Wiring struct {
	Deps
	writers.Shared
	// Watch restarts a dead writer before its detach.
	Watch *writers.Watch
}

// Volumes is the persistent volumes of generations: the volumes entry of
// the resource table.
type Volumes struct {
	d Wiring
	// has says the node attaches persistent volumes: New decides it once
	// from d (writers, sealer, store, mounts, freezer and a writers dir).
	has bool
}

// New is the volumes entry over d.
func New(d Wiring) *Volumes {
	has := d.Writers.Devices != nil && d.Writers.Sealer != nil && d.Store != nil && d.Mounts != nil && d.Freezer != nil && d.Config.WritersDir != ""
	return &Volumes{d: d, has: has}
}

// Register adds the volumes entry to b; absent on a node without
// persistent volumes (r may be nil where only its spec is read).
func Register(b *resource.Builder[*resource.Claim], r *Volumes) {
	b.Add(r, r != nil && r.has)
}

func (r *Volumes) live() error          { return r.d.Term.Live() }
func (r *Volumes) crash(point string)   { r.d.Crash(point) }
func (r *Volumes) marks() writers.Marks { return writers.Marks{Journal: r.d.Journal, Log: r.d.Log} }

// volumesRoot holds the volume writers' dirs, one dir per generation.
func (r *Volumes) volumesRoot() string { return filepath.Join(r.d.Config.WritersDir, "vol") }

// volumesDir is the dir of cid's volume writers.
func (r *Volumes) volumesDir(cid string) string { return filepath.Join(r.volumesRoot(), cid) }

// Has says whether this node can attach persistent volumes.
func (r *Volumes) Has() bool { return r.has }

// Check refuses, before anything is journaled, a claim naming volumes
// this node cannot attach (unavailable) or that do not exist
// (not_found).
func (r *Volumes) Check(ctx context.Context, req journal.ClaimRequest) error {
	if len(req.Volumes) == 0 {
		return nil
	}
	if !r.Has() {
		return errdefs.Errorf(errdefs.CodeUnavailable, "persistent volumes: this node has no block store, writers and volume mounts configured")
	}
	for _, v := range req.Volumes {
		h, err := r.d.Store.Head(ctx, v.ID)
		if err != nil {
			return errdefs.Errorf(errdefs.CodeUnavailable, "head of volume %s: %v", v.ID, err)
		}
		if err := r.marks().Floor(writers.PersistentVolume(v.ID), h, v.ExpectHead); err != nil {
			return err
		}
		if h.Seq == 0 {
			return errdefs.Errorf(errdefs.CodeNotFound, "volume %q not found (ctl-manager volume create)", v.ID)
		}
	}
	return nil
}

// Admit refuses, inside the claim's admitting transaction, a
// volume another generation holds: the single writer of a volume on this
// node. (Across nodes the head's compare-and-swap at detach fences the
// stale writer.)
func Admit(live []journal.Sandbox, rec journal.Sandbox) error {
	if rec.Request == nil {
		return nil
	}
	for _, v := range rec.Request.Volumes {
		for _, s := range live {
			if s.ID == rec.ID && s.Generation == rec.Generation {
				continue
			}
			if !s.Holds() && !s.Withheld {
				continue
			}
			if s.Request != nil && slices.ContainsFunc(s.Request.Volumes, func(w journal.VolumeMount) bool { return w.ID == v.ID }) {
				return errdefs.Errorf(errdefs.CodeConflict, "volume %s is attached to sandbox %s generation %d (%s)", v.ID, s.ID, s.Generation, s.State)
			}
		}
	}
	return nil
}

// putVolume journals av as the generation's attach of av.ID; also runs
// first in the same transaction and may fill in *av (the epoch).
func putVolume(j *journal.Journal, rec journal.Sandbox, av *journal.AttachedVolume, also func(*journal.Tx) error) error {
	return op.PutGeneration(j, rec, also, func(s *journal.Sandbox) {
		i := slices.IndexFunc(s.Volumes, func(v journal.AttachedVolume) bool { return v.ID == av.ID })
		if i < 0 {
			s.Volumes = append(s.Volumes, *av)
		} else {
			s.Volumes[i] = *av
		}
	})
}

// setVolume sets av in rec's Volumes (memory), as putVolume journaled it.
func setVolume(rec *journal.Sandbox, av journal.AttachedVolume) {
	i := slices.IndexFunc(rec.Volumes, func(v journal.AttachedVolume) bool { return v.ID == av.ID })
	if i < 0 {
		rec.Volumes = append(rec.Volumes, av)
		return
	}
	vs := slices.Clone(rec.Volumes)
	vs[i] = av
	rec.Volumes = vs
}

func (r *Volumes) Spec() resource.Spec {
	return resource.Spec{Kind: journal.KindVolumes, Phase: resource.PhaseRootFS, Check: "volumes_detached", Sweeps: true, RemovePoints: []string{"volumes:sealed"}}
}

// needed: a claim that names no volumes neither journals nor runs this
// entry (its proof check still runs).
func (*Volumes) Needed(rec journal.Sandbox) bool { return len(wanted(rec)) > 0 }

// wanted are the volumes rec's claim attaches.
func wanted(rec journal.Sandbox) []journal.VolumeMount {
	if rec.Request == nil {
		return nil
	}
	return rec.Request.Volumes
}

// Make attaches each of the claim's volumes: epoch journaled, writer
// started over the volume's head, device mounted on the host; the mounts
// become the bundle's binds.
func (r *Volumes) Make(ctx context.Context, c *resource.Claim) error {
	vs := wanted(c.Rec)
	for _, v := range vs {
		mnt, err := r.attach(ctx, c, v)
		if err != nil {
			return fmt.Errorf("attach volume %s: %w", v.ID, err)
		}
		c.Binds = append(c.Binds, runsc.Bind{Source: mnt, Destination: v.Path})
	}
	return nil
}

func (r *Volumes) attach(ctx context.Context, c *resource.Claim, v journal.VolumeMount) (string, error) {
	rec := c.Rec
	h, err := r.d.Store.Head(ctx, v.ID)
	if err != nil {
		return "", errdefs.Errorf(errdefs.CodeUnavailable, "head: %v", err)
	}
	if err := r.marks().Floor(writers.PersistentVolume(v.ID), h, v.ExpectHead); err != nil {
		return "", err
	}
	if h.Seq == 0 {
		return "", errdefs.Errorf(errdefs.CodeNotFound, "volume %q has no head (deleted?)", v.ID)
	}
	av := journal.AttachedVolume{ID: v.ID, Path: v.Path, Dir: filepath.Join(r.volumesDir(rec.ContainerID), v.ID), Index: -1, Head: h}
	err = putVolume(r.d.Journal, rec, &av, func(tx *journal.Tx) (err error) {
		av.WriterEpoch, err = tx.NextWriterEpoch()
		return err
	})
	if err != nil {
		return "", fmt.Errorf("journal writer epoch: %w", err)
	}
	setVolume(&c.Rec, av)
	if err := r.live(); err != nil {
		return "", err
	}
	vol := blockstore.Vol(v.ID)
	spec := r.d.Config.Spec(rec.ID, rec.Generation, av.WriterEpoch, blockstore.GenRef{Volume: vol, Generation: h.Generation}, av.Dir)
	spec.Volume = vol
	st, err := r.d.Writers.Devices.Start(ctx, spec)
	if err != nil {
		return "", fmt.Errorf("start writer: %w", err)
	}
	av.Index, av.PID, av.Size = st.Index, st.PID, st.Size
	if err := putVolume(r.d.Journal, rec, &av, nil); err != nil {
		return "", fmt.Errorf("journal writer device: %w", err)
	}
	setVolume(&c.Rec, av)
	mnt, err := r.d.Mounts.Mount(ctx, v.ID, st.Device)
	if err != nil {
		return "", fmt.Errorf("mount: %w", err)
	}
	av.Mount = mnt
	if dev, err := r.d.Mounts.Superblock(v.ID); err == nil {
		av.RootDev = dev
	}
	if err := putVolume(r.d.Journal, rec, &av, nil); err != nil {
		return "", fmt.Errorf("journal mount: %w", err)
	}
	setVolume(&c.Rec, av)
	return mnt, nil
}

// Remove detaches every volume of rec: each journaled attach is sealed
// and published (once), unmounted and its writer stopped; writer dirs the
// journal does not name (a generation this journal does not know, or a
// record that moved on) are sealed and published if their spec proves
// which attach they are (sealUnrecorded), and stopped. The generation's
// dir goes last.
func (r *Volumes) Remove(ctx context.Context, rec journal.Sandbox) error {
	dir := r.volumesDir(rec.ContainerID)
	var errs []error
	seen := map[string]bool{}
	for _, av := range rec.Volumes {
		seen[av.ID] = true
		if err := r.detach(ctx, &rec, av); err != nil {
			errs = append(errs, fmt.Errorf("detach volume %s: %w", av.ID, err))
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("list volume writers of %s: %w", rec.ContainerID, err))
	}
	for _, e := range ents {
		if seen[e.Name()] {
			continue
		}
		r.sealUnrecorded(ctx, rec.ContainerID, e.Name(), filepath.Join(dir, e.Name()))
		if err := r.stop(ctx, e.Name(), filepath.Join(dir, e.Name()), rec); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove volume writers dir: %w", err)
	}
	// The shared parent goes when empty (another attach's MkdirAll makes
	// it again), so no dir of ctld's outlives its last volume.
	if err := os.Remove(r.volumesRoot()); err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTEMPTY) && !errors.Is(err, syscall.EEXIST) {
		return fmt.Errorf("remove volume writers root: %w", err)
	}
	return nil
}

// sealUnrecorded seals and publishes the volume writer of dir (volume
// id, generation cid) that no attach record names (the generation's
// record is not in this journal, or moved on), when what its spec.json
// and the store say proves which attach it is and that its head has not
// moved since: the spec names cid's sandbox and generation and volume
// id, the writer runs with the spec's epoch (its dirty data is that
// attach's), no journaled generation holds the volume (its host mount is
// the orphan's), and the volume's head is still at the spec's base
// generation (every publish of a volume commits a new generation, so
// none happened since the attach) with an epoch not newer than the
// spec's. The publish is then the compare-and-swap over that head.
// Otherwise, or if the seal or publish fails, the writer is stopped
// without a seal (logged), as a sweep cannot be withheld: best effort.
func (r *Volumes) sealUnrecorded(ctx context.Context, cid, id, dir string) {
	log := r.d.Log.With("container", cid, "volume", id, "dir", dir)
	why := func() string {
		b, err := os.ReadFile(filepath.Join(dir, writer.SpecName))
		if err != nil {
			return err.Error()
		}
		var spec writer.Spec
		if err := json.Unmarshal(b, &spec); err != nil {
			return "spec: " + err.Error()
		}
		sbx, gen, ok := names.ParseGeneration(cid)
		vol := blockstore.Vol(id)
		if !ok || spec.Sandbox != sbx || spec.Generation != gen || spec.Volume != vol || spec.Base.Volume != vol {
			return fmt.Sprintf("its spec (sandbox %s generation %d, volume %s over %s) is not this dir's attach", spec.Sandbox, spec.Generation, spec.Volume, spec.Base.Volume)
		}
		st, err := r.d.Writers.Devices.Check(ctx, dir)
		if err != nil || st.Epoch != spec.Epoch {
			return fmt.Sprintf("no writer of the spec's epoch %d runs (%v)", spec.Epoch, err)
		}
		rec := journal.Sandbox{ID: sbx, Generation: gen, ContainerID: cid}
		if held, err := r.volumeHeldElsewhere(id, rec); err != nil || held {
			return fmt.Sprintf("the volume is held by a journaled generation (%v)", err)
		}
		h, err := r.d.Store.Head(ctx, id)
		if err != nil || h.Seq == 0 || h.Generation != spec.Base.Generation || h.WriterEpoch > spec.Epoch {
			return fmt.Sprintf("the head %+v (%v) is not the attach's base generation %d", h, err, spec.Base.Generation)
		}
		av := journal.AttachedVolume{ID: id, Dir: dir, Index: st.Index, WriterEpoch: spec.Epoch, Head: h}
		av, err = r.sealAndPublish(ctx, rec, av)
		switch {
		case err != nil:
			return err.Error()
		case av.Published == nil:
			return av.PublishError
		}
		if err := r.marks().Note(writers.PersistentVolume(id), *av.Published); err != nil {
			return "published, but its head mark not journaled: " + err.Error()
		}
		log.Warn("sealed and published a volume writer no attach record names", "head", av.Published.Seq, "block_generation", av.Published.Generation, "writer_epoch", spec.Epoch)
		return ""
	}()
	if why != "" {
		log.Warn("stopping a volume writer no attach record names without a seal: its writes are not in the volume", "why", why)
	}
}

// detach seals and publishes av (unless done), then stops it. A dead
// writer is restarted first (writerwatch.go).
func (r *Volumes) detach(ctx context.Context, rec *journal.Sandbox, av journal.AttachedVolume) error {
	if av.Published == nil && av.PublishError == "" {
		if err := r.d.Watch.Runs(ctx, *rec, av.ID); errors.Is(err, writer.ErrNotRunning) && av.Index >= 0 {
			// Its writer died before the watch restarted it: the next one
			// re-attaches the device over the same dirty file, so the
			// seal still has every write a flush acknowledged.
			rs, rerr := r.d.Watch.Restart(ctx, *rec, av.ID, err)
			if rerr != nil && r.live() != nil {
				return rerr
			}
			if rerr != nil {
				r.d.Log.Error("volume writer not restarted for its detach", "sandbox", rec.ID, "generation", rec.Generation, "volume", av.ID, "err", rerr)
			}
			*rec = rs
			if i := slices.IndexFunc(rs.Volumes, func(v journal.AttachedVolume) bool { return v.ID == av.ID }); i >= 0 {
				av = rs.Volumes[i]
			}
		}
		var err error
		if av, err = r.sealAndPublish(ctx, *rec, av); err != nil {
			return err
		}
		if err := putVolume(r.d.Journal, *rec, &av, publishedMark(av)); err != nil {
			return fmt.Errorf("journal publish: %w", err)
		}
		setVolume(rec, av)
	}
	return r.stop(ctx, av.ID, av.Dir, *rec)
}

// sealAndPublish seals av's device and publishes it over av.Head. A lost
// compare-and-swap, or a writer that is not av's, is recorded on the
// returned attach (the proof reports it); any other failure is an error.
func (r *Volumes) sealAndPublish(ctx context.Context, rec journal.Sandbox, av journal.AttachedVolume) (journal.AttachedVolume, error) {
	log := r.d.Log.With("sandbox", rec.ID, "generation", rec.Generation, "volume", av.ID, "writer_epoch", av.WriterEpoch)
	st, err := r.d.Writers.Devices.Check(ctx, av.Dir)
	if err != nil || st.Epoch != av.WriterEpoch || av.Index < 0 {
		av.PublishError = fmt.Sprintf("not sealed: the attach's writer (epoch %d) is not running; its writes are not in the volume", av.WriterEpoch)
		log.Error("volume detached without a seal", "err", av.PublishError)
		return av, nil
	}
	gens, err := r.d.Store.Generations(ctx, av.ID)
	if err != nil {
		return av, fmt.Errorf("list generations: %w", err)
	}
	next := uint64(1)
	if len(gens) > 0 {
		next = slices.Max(gens) + 1
	}
	if err := r.live(); err != nil {
		return av, err
	}
	thaw, err := r.d.Freezer.Freeze(ctx, av.ID)
	if err != nil {
		return av, fmt.Errorf("freeze: %w", err)
	}
	res, serr := r.d.Writers.Sealer.Seal(ctx, av.Dir, next, av.WriterEpoch)
	if terr := thaw(); serr != nil || terr != nil {
		return av, errors.Join(serr, terr)
	}
	r.crash("volumes:sealed")
	cur := av.Head
	h, err := r.d.Store.Publish(ctx, av.ID, cur, journal.VolumeHead{Generation: res.Generation, WriterEpoch: av.WriterEpoch, Node: r.d.NodeID})
	switch {
	case err == nil:
	case errdefs.CodeOf(err) == errdefs.CodeFenced:
		// Our own publish of an earlier try (its journal record lost)?
		if now, herr := r.d.Store.Head(ctx, av.ID); herr == nil && now.Seq > cur.Seq && now.WriterEpoch == av.WriterEpoch {
			h = now
			break
		}
		av.PublishError = "not published: " + err.Error()
		log.Error("volume's seal not published: its head moved or the volume was deleted; this attach's writes are not in the volume", "sealed_generation", res.Generation, "err", err)
		return av, nil
	default:
		return av, fmt.Errorf("publish: %w", err)
	}
	jh := h
	av.Published = &jh
	log.Info("volume sealed and published", "head", h.Seq, "block_generation", h.Generation, "bytes", res.Bytes)
	return av, nil
}

// publishedMark raises av's volume's head mark to its published head
// (if any), in the transaction that journals the publish.
func publishedMark(av journal.AttachedVolume) func(*journal.Tx) error {
	return func(tx *journal.Tx) error {
		if av.Published == nil {
			return nil
		}
		return writers.RaiseMark(tx, writers.PersistentVolume(av.ID), *av.Published)
	}
}

// stop unmounts volume id (unless another generation holds it) and stops
// the writer of dir, removing dir.
func (r *Volumes) stop(ctx context.Context, id, dir string, rec journal.Sandbox) error {
	held, err := r.volumeHeldElsewhere(id, rec)
	if err != nil {
		return err
	}
	if !held {
		if err := r.d.Mounts.Unmount(ctx, id); err != nil {
			return fmt.Errorf("unmount volume %s: %w", id, err)
		}
	}
	if err := r.d.Writers.Devices.Stop(ctx, dir); err != nil {
		return fmt.Errorf("stop writer of volume %s: %w", id, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove writer dir of volume %s: %w", id, err)
	}
	return nil
}

// volumeHeldElsewhere reports whether a generation other than rec's
// holds volume id (its mount is then that generation's).
func (r *Volumes) volumeHeldElsewhere(id string, rec journal.Sandbox) (bool, error) {
	held := false
	err := r.d.Journal.View(func(tx *journal.Tx) error {
		live, err := tx.LiveSandboxes()
		if err != nil {
			return err
		}
		for _, s := range live {
			if s.ID == rec.ID && s.Generation == rec.Generation {
				continue
			}
			if (s.Holds() || s.Withheld) && slices.ContainsFunc(wanted(s), func(v journal.VolumeMount) bool { return v.ID == id }) {
				held = true
			}
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("read journal: %w", err)
	}
	return held, nil
}

// gone: every attach's writer gone and its device quiescent, its mount
// gone, the generation's dir gone. The detail names each volume's
// published head, or why none was published.
func (r *Volumes) Gone(ctx context.Context, rec journal.Sandbox) proof.Check {
	dir := r.volumesDir(rec.ContainerID)
	// The teardown journaled each detach's outcome after rec was read.
	_ = r.d.Journal.View(func(tx *journal.Tx) error {
		if s, ok, err := tx.Sandbox(rec.ID); err == nil && ok && s.Generation == rec.Generation {
			rec.Volumes = s.Volumes
		}
		return nil
	})
	if len(rec.Volumes) == 0 && len(wanted(rec)) == 0 {
		ok, d := pathAbsent(dir)
		return resource.Check("volumes_detached", ok, "no volumes; "+d)
	}
	ok := true
	var parts []string
	for _, av := range rec.Volumes {
		wok, wd := r.d.Writers.Devices.CheckGone(ctx, av.Dir, av.Index)
		mok, md := r.d.Mounts.CheckGone(ctx, av.ID, av.RootDev)
		if held, err := r.volumeHeldElsewhere(av.ID, rec); err != nil {
			mok, md = false, err.Error()
		} else if held {
			// Its mount is the holder's now; this attach's device is what
			// the writer check proves gone.
			mok, md = true, "mount held by a later generation"
		}
		ok = ok && wok && mok
		state := "not attached"
		switch {
		case av.Published != nil:
			state = fmt.Sprintf("published head %d (generation %d)", av.Published.Seq, av.Published.Generation)
		case av.PublishError != "":
			state = av.PublishError
		}
		parts = append(parts, fmt.Sprintf("%s: %s; %s; %s", av.ID, state, wd, md))
	}
	dok, dd := pathAbsent(dir)
	ok = ok && dok
	parts = append(parts, dd)
	return resource.Check("volumes_detached", ok, strings.Join(parts, "; "))
}

// pathAbsent says whether p does not exist.
func pathAbsent(p string) (bool, string) {
	_, err := os.Lstat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return true, p + " absent"
	case err != nil:
		return false, err.Error()
	}
	return false, p + " exists"
}

// List names the generations (container ids) with a volume writers dir.
func (r *Volumes) List(context.Context) ([]string, error) {
	return resource.DirEntries(r.volumesRoot())
}

func (*Volumes) Name(rec journal.Sandbox) string {
	if len(wanted(rec)) == 0 && len(rec.Volumes) == 0 {
		return ""
	}
	return resource.NameOf(rec)
}

// RemoveOrphan stops what a generation no record owns left, each volume
// writer sealed and published first if its spec proves its attach
// (sealUnrecorded).
func (r *Volumes) RemoveOrphan(ctx context.Context, cid string) error {
	return r.Remove(ctx, journal.Sandbox{ContainerID: cid})
}

// missing: a ready generation's volume writers must run, of their epochs.
func (r *Volumes) Survey(context.Context) (resource.Missing, error) {
	return func(ctx context.Context, rec journal.Sandbox) string {
		if len(rec.Volumes) == 0 {
			return ""
		}
		for _, av := range rec.Volumes {
			st, err := r.d.Writers.Devices.Check(ctx, av.Dir)
			if err != nil || st.Epoch != av.WriterEpoch {
				return "volume writer " + av.ID
			}
		}
		return ""
	}, nil
}
