package blockroot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/op"
	"github.com/ctld/ctld/internal/node/writers"
)

// Durable block roots (issue 10; DESIGN.md "RootFS"). A block-mode
// sandbox's files are a chain of committed generations in the block store
// (the sandbox's volume). A seal freezes the mounted root (FIFREEZE: the
// filesystem's dirty data reaches the device, new writes wait), has the
// writer commit the device's dirty chunks as the volume's next generation
// and rebase onto it, and thaws: the freeze is the guest's write barrier,
// and it lasts as long as the dirty data takes, not the disk size. A pause
// is a seal, the head's compare-and-swap publish (over the head the claim
// started from, with the writer's epoch: a stale writer is fenced), then
// the generation's release with its cleanup proof; the next claim of the
// sandbox starts from the head (a resume). What the guest writes between
// the thaw and the release is not part of the pause.

// ms is d in milliseconds (a seal's timings).
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// hasVolumes reports whether this node can seal and publish block roots.
func (n *Root) hasVolumes() bool { return n.durable }

func (n *Root) needVolumes(call string) error {
	if !n.hasVolumes() {
		return errdefs.Errorf(errdefs.CodeUnavailable, "%s: this node has no durable block store (block store, writers and sealing configured)", call)
	}
	return nil
}

// sealable checks that s is a ready block-mode generation.
func sealable(s journal.Sandbox, call string) error {
	if writers.RootFSMode(s) != journal.RootFSBlock {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "%s of sandbox %q: its rootfs mode is %s; only block-mode roots are durable", call, s.ID, writers.RootFSMode(s))
	}
	if s.State != journal.StateReady || s.Block == nil {
		return errdefs.Errorf(errdefs.CodeConflict, "%s of sandbox %q: generation %d is %s, not ready", call, s.ID, s.Generation, s.State)
	}
	return nil
}

// seal freezes rec's root, seals its device as the volume's next
// generation and thaws it; it journals the device's new base (the writer
// rebased onto the sealed generation) and returns the seal with rec
// updated.
func (n *Root) seal(ctx context.Context, rec *journal.Sandbox) (journal.SealResult, error) {
	t0 := time.Now()
	gens, err := n.d.Volumes.Generations(ctx, rec.ID)
	if err != nil {
		return journal.SealResult{}, errdefs.Errorf(errdefs.CodeUnavailable, "list the generations of sandbox %s: %v", rec.ID, err)
	}
	next := uint64(1)
	if len(gens) > 0 {
		next = slices.Max(gens) + 1
	}
	if err := n.live(); err != nil {
		return journal.SealResult{}, err
	}
	thaw, err := n.d.Freezer.Freeze(ctx, rec.ContainerID)
	if err != nil {
		return journal.SealResult{}, fmt.Errorf("freeze the root of %s: %w", rec.ContainerID, err)
	}
	tf := time.Now()
	res, serr := n.d.Writers.Sealer.Seal(ctx, n.writerDir(*rec), next, rec.Block.WriterEpoch)
	terr := thaw()
	res.FreezeMS = ms(time.Since(tf))
	if serr != nil {
		return journal.SealResult{}, errors.Join(fmt.Errorf("seal the device of %s: %w", rec.ContainerID, serr), terr)
	}
	if terr != nil {
		return journal.SealResult{}, fmt.Errorf("thaw the root of %s: %w", rec.ContainerID, terr)
	}
	b := *rec.Block
	b.BaseVolume, b.BaseGeneration = blockstore.Sandbox(rec.ID).String(), res.Generation
	if err := n.putBlock(*rec, &b, nil); err != nil {
		return journal.SealResult{}, fmt.Errorf("journal the device's new base: %w", err)
	}
	rec.Block = &b
	res.TotalMS = ms(time.Since(t0))
	n.d.Log.Info("sealed", "sandbox", rec.ID, "generation", rec.Generation, "block_generation", res.Generation,
		"chunks", res.Chunks, "bytes", res.Bytes, "freeze_ms", res.FreezeMS, "total_ms", res.TotalMS)
	return res, nil
}

// PauseRequest is a pause of sandbox's generation Generation (0:
// whichever runs) under operation OperationID, whose request hash is
// RequestHash (the node's, over its wire request).
type PauseRequest struct {
	OperationID string
	Generation  uint64
	RequestHash string
}

// Pause seals the running block generation, publishes it as the
// sandbox's head and releases the generation; it returns the answer
// stored with the cleanup proof (Answers.Paused).
func (n *Root) Pause(ctx context.Context, id string, req PauseRequest) (json.RawMessage, error) {
	if err := n.needVolumes("pause"); err != nil {
		return nil, err
	}
	o := journal.Operation{
		ID: req.OperationID, Kind: journal.OpPause, SandboxID: id, Generation: req.Generation,
		RequestHash: req.RequestHash, State: journal.OpPending, Epoch: n.d.Epoch, Created: time.Now().UTC(),
	}
	ctx, end, err := n.d.Term.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer end()
	unlock := n.d.Locks.Lock(id)
	var rec journal.Sandbox
	got, started, err := n.d.Ops.Begin(ctx, o, func(tx *journal.Tx) error {
		s, err := op.Current(tx, id, req.Generation, "pause")
		if err != nil {
			return err
		}
		if err := sealable(s, "pause"); err != nil {
			return err
		}
		s.Seal = &journal.SealRecord{State: journal.SealSealing, OperationID: req.OperationID}
		rec = s
		return tx.PutSandbox(s)
	})
	if err != nil || !started {
		unlock()
		if err != nil {
			return nil, err
		}
		return op.Outcome(got)
	}
	defer n.d.Ops.End(o.ID)
	head, res, err := n.sealAndPublish(ctx, &rec)
	if err != nil {
		unlock()
		n.abandonSeal(rec, o.ID, err)
		return nil, err
	}
	err = n.publishedSeal(rec, o.ID, head, res)
	unlock()
	if err != nil {
		// The head moved; the takeover's reconcile finds it and completes
		// the pause (settleSeal).
		return nil, errdefs.Errorf(errdefs.CodeUnavailable, "pause %s: head published, but journaling it failed: %v", o.ID, err)
	}
	rec.State, rec.ReleaseOp = journal.StateReleasing, o.ID
	return n.finishPause(rec, o.ID)
}

// sealAndPublish seals rec's device and publishes it as the volume's head
// over the head its claim started from.
func (n *Root) sealAndPublish(ctx context.Context, rec *journal.Sandbox) (journal.VolumeHead, journal.SealResult, error) {
	res, err := n.seal(ctx, rec)
	if err != nil {
		return journal.VolumeHead{}, res, err
	}
	n.crash("pause:sealed")
	if err := n.live(); err != nil {
		return journal.VolumeHead{}, res, err
	}
	next := journal.VolumeHead{Generation: res.Generation, WriterEpoch: headEpoch(*rec), Node: n.d.NodeID}
	head, err := n.d.Volumes.Publish(ctx, rec.ID, rec.Block.Head, next)
	if err != nil {
		if errdefs.CodeOf(err) == errdefs.CodeFenced {
			return head, res, err
		}
		return head, res, errdefs.Errorf(errdefs.CodeUnavailable, "publish the head of sandbox %s: %v", rec.ID, err)
	}
	n.crash("pause:published")
	return head, res, nil
}

// publishedSeal journals a published pause: the generation is releasing
// under the pause's operation.
func (n *Root) publishedSeal(rec journal.Sandbox, opID string, head journal.VolumeHead, res journal.SealResult) error {
	result, err := json.Marshal(res)
	if err != nil {
		return err
	}
	also := func(tx *journal.Tx) error { return writers.RaiseMark(tx, writers.SandboxVolume(rec.ID), head) }
	return op.PutGeneration(n.d.Journal, rec, also, func(s *journal.Sandbox) {
		s.Seal = &journal.SealRecord{State: journal.SealPublished, OperationID: opID, Generation: res.Generation, Head: head, Result: result}
		s.State, s.ReleaseOp = journal.StateReleasing, opID
	})
}

// abandonSeal journals a pause that did not publish: the head is as it
// was, the generation keeps running, and the operation failed with err.
func (n *Root) abandonSeal(rec journal.Sandbox, opID string, cause error) {
	code := errdefs.CodeOf(cause)
	if code == "" {
		code = errdefs.CodeInternal
	}
	err := n.d.Journal.Update(func(tx *journal.Tx) error {
		s, ok, err := tx.Sandbox(rec.ID)
		if err != nil || !ok || s.Generation != rec.Generation {
			return err
		}
		s.Seal = &journal.SealRecord{State: journal.SealAbandoned, OperationID: opID, Error: cause.Error()}
		if err := tx.PutSandbox(s); err != nil {
			return err
		}
		op, ok, err := tx.Operation(opID)
		if err != nil || !ok || op.State != journal.OpPending {
			return err
		}
		op.State, op.Error = journal.OpFailed, &journal.OpError{Code: code, Message: cause.Error()}
		return tx.PutOperation(op)
	})
	if err != nil {
		n.d.Log.Error("journal abandoned seal", "sandbox", rec.ID, "op", opID, "err", err)
	}
	n.d.Log.Warn("pause abandoned; the head is unchanged and the generation keeps running", "sandbox", rec.ID, "generation", rec.Generation, "err", cause)
}

// finishPause releases a published pause's generation (the teardown stores
// the pause's answer with its proof) and answers it.
func (n *Root) finishPause(rec journal.Sandbox, opID string) (json.RawMessage, error) {
	td, cancel := n.d.Term.Background(2 * time.Minute)
	defer cancel()
	_, terr := n.d.Teardown.Teardown(td, rec, opID, journal.StateReleased, "paused")
	if errors.Is(terr, op.ErrTermOver) {
		return nil, errdefs.Errorf(errdefs.CodeUnavailable, "pause %s: the head is published; its release was interrupted by the end of this primary's term and the next primary completes it; retry the same operation_id", opID)
	}
	if terr != nil {
		n.d.Log.Warn("pause's release left objects behind; capacity withheld", "sandbox", rec.ID, "generation", rec.Generation, "err", terr)
	}
	ans, err := n.storedAnswer(opID)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.CodeInternal, "pause of %s: cleanup proof not journaled: %v", rec.ID, errors.Join(err, terr))
	}
	return ans, nil
}

// Settle resolves, on takeover, a pause that was sealing when the
// last primary stopped: if its head was published (the head names this
// generation's writer epoch and moved past the one the claim started
// from), the pause completes (the generation is released under it);
// otherwise it is abandoned and the generation keeps running.
func (n *Root) Settle(ctx context.Context, s journal.Sandbox) (journal.Sandbox, bool) {
	if s.Seal == nil || s.Seal.State != journal.SealSealing || !n.durable {
		return s, false
	}
	// The last primary may have died with the root frozen.
	if err := n.d.Freezer.Thaw(ctx, s.ContainerID); err != nil {
		n.d.Log.Warn("thaw the root of an interrupted seal", "sandbox", s.ID, "generation", s.Generation, "err", err)
	}
	if s.Block == nil {
		return s, false
	}
	opID := s.Seal.OperationID
	h, err := n.d.Volumes.Head(ctx, s.ID)
	if err == nil && h.Seq > s.Block.Head.Seq && h.WriterEpoch == headEpoch(s) {
		res := journal.SealResult{Generation: h.Generation}
		if perr := n.publishedSeal(s, opID, h, res); perr == nil {
			s.State, s.ReleaseOp = journal.StateReleasing, opID
			s.Seal = &journal.SealRecord{State: journal.SealPublished, OperationID: opID, Generation: h.Generation, Head: h}
			n.d.Log.Info("completing a pause interrupted by failover after its head was published", "sandbox", s.ID, "head", h.Seq)
			return s, true
		}
	}
	cause := errdefs.Errorf(errdefs.CodeUnavailable, "pause interrupted by failover of the primary before its head was published; the head is unchanged and the generation keeps running (its writes since are its dirty tail); retry with a new operation_id")
	if err != nil {
		cause = errdefs.Errorf(errdefs.CodeUnavailable, "pause interrupted by failover; the volume's head could not be read (%v), so the pause is abandoned and the generation keeps running", err)
	}
	n.abandonSeal(s, opID, cause)
	s.Seal = &journal.SealRecord{State: journal.SealAbandoned, OperationID: opID, Error: cause.Error()}
	return s, false
}

// Snapshot seals the running generation under name while the guest
// runs, and returns the named snapshot and what the seal did.
func (n *Root) Snapshot(ctx context.Context, id, name string) (blockstore.Snapshot, journal.SealResult, error) {
	var res journal.SealResult
	snap, err := volumeCall(n, ctx, id, "snapshot", func(ctx context.Context) (snap blockstore.Snapshot, err error) {
		snap, res, err = n.snapshot(ctx, id, name)
		return snap, err
	})
	return snap, res, err
}

func (n *Root) snapshot(ctx context.Context, id, name string) (blockstore.Snapshot, journal.SealResult, error) {
	var none blockstore.Snapshot
	rec, err := n.sandbox(id)
	if err != nil {
		return none, journal.SealResult{}, err
	}
	if err := sealable(rec, "snapshot"); err != nil {
		return none, journal.SealResult{}, err
	}
	snaps, err := n.d.Volumes.Snapshots(ctx, id)
	if err != nil {
		return none, journal.SealResult{}, errdefs.Errorf(errdefs.CodeUnavailable, "snapshots of %s: %v", id, err)
	}
	for _, s := range snaps {
		if s.Name == name {
			return none, journal.SealResult{}, errdefs.Errorf(errdefs.CodeConflict, "sandbox %s has a snapshot %q already (generation %d)", id, name, s.Generation)
		}
	}
	res, err := n.seal(ctx, &rec)
	if err != nil {
		return none, res, err
	}
	if err := n.d.Volumes.PutSnapshot(ctx, id, name, res.Generation); err != nil {
		return none, res, err
	}
	return blockstore.Snapshot{Name: name, Generation: res.Generation}, res, nil
}

// VolumeInfo is a sandbox volume's head, snapshots and committed
// generations.
type VolumeInfo struct {
	Sandbox     string
	Head        journal.VolumeHead
	Snapshots   []blockstore.Snapshot
	Generations []uint64
}

// Volume is sandbox id's volume (not_found: it has none).
func (n *Root) Volume(ctx context.Context, id string) (VolumeInfo, error) {
	if err := n.needVolumes("volume"); err != nil {
		return VolumeInfo{}, err
	}
	out := VolumeInfo{Sandbox: id, Snapshots: []blockstore.Snapshot{}, Generations: []uint64{}}
	var err error
	if out.Head, err = n.d.Volumes.Head(ctx, id); err != nil {
		return out, errdefs.Errorf(errdefs.CodeUnavailable, "head of %s: %v", id, err)
	}
	if out.Snapshots, err = n.d.Volumes.Snapshots(ctx, id); err != nil {
		return out, errdefs.Errorf(errdefs.CodeUnavailable, "snapshots of %s: %v", id, err)
	}
	if out.Generations, err = n.d.Volumes.Generations(ctx, id); err != nil {
		return out, errdefs.Errorf(errdefs.CodeUnavailable, "generations of %s: %v", id, err)
	}
	if out.Head.Seq == 0 && len(out.Generations) == 0 && len(out.Snapshots) == 0 {
		return out, errdefs.Errorf(errdefs.CodeNotFound, "sandbox %q has no volume in the block store (never paused, snapshotted or forked)", id)
	}
	return out, nil
}

// snapshotGen is the generation of src's snapshot name, or of its head
// without a name.
func (n *Root) snapshotGen(ctx context.Context, src, name string) (uint64, error) {
	if name == "" {
		h, err := n.d.Volumes.Head(ctx, src)
		if err != nil {
			return 0, errdefs.Errorf(errdefs.CodeUnavailable, "head of %s: %v", src, err)
		}
		if h.Seq == 0 {
			return 0, errdefs.Errorf(errdefs.CodeNotFound, "sandbox %q has no head (pause it first, or name a snapshot)", src)
		}
		return h.Generation, nil
	}
	snaps, err := n.d.Volumes.Snapshots(ctx, src)
	if err != nil {
		return 0, errdefs.Errorf(errdefs.CodeUnavailable, "snapshots of %s: %v", src, err)
	}
	for _, s := range snaps {
		if s.Name == name {
			return s.Generation, nil
		}
	}
	return 0, errdefs.Errorf(errdefs.CodeNotFound, "sandbox %q has no snapshot %q", src, name)
}

// volumeCall runs fn as an operation of this term on sandbox id (the
// sandbox's lock held), if this node has durable block roots.
func volumeCall[T any](n *Root, ctx context.Context, id, call string, fn func(context.Context) (T, error)) (T, error) {
	var zero T
	if err := n.needVolumes(call); err != nil {
		return zero, err
	}
	ctx, end, err := n.d.Term.Begin(ctx)
	if err != nil {
		return zero, err
	}
	defer end()
	unlock := n.d.Locks.Lock(id)
	defer unlock()
	return fn(ctx)
}

// notRunning refuses a call on a sandbox with a live generation.
func (n *Root) notRunning(id, call string) error {
	s, err := n.sandbox(id)
	if errdefs.CodeOf(err) == errdefs.CodeNotFound {
		return nil
	}
	if err != nil {
		return err
	}
	if s.Holds() {
		return errdefs.Errorf(errdefs.CodeConflict, "%s of sandbox %q: its generation %d is %s; pause or release it first", call, id, s.Generation, s.State)
	}
	return nil
}

// ForkRequest makes a sandbox a new identity over Source's committed
// generation: its snapshot Snapshot, or its head without one.
type ForkRequest struct {
	Source, Snapshot string
}

// Fork makes id's volume a generation 0 over the source's committed
// generation, published as id's first head.
func (n *Root) Fork(ctx context.Context, id string, req ForkRequest) (VolumeInfo, error) {
	if req.Source == id {
		return VolumeInfo{}, errdefs.Errorf(errdefs.CodeInvalidArgument, "fork of %s onto itself: use restore", id)
	}
	return volumeCall(n, ctx, id, "fork", func(ctx context.Context) (VolumeInfo, error) { return n.fork(ctx, id, req) })
}

func (n *Root) fork(ctx context.Context, id string, req ForkRequest) (VolumeInfo, error) {
	if err := n.notRunning(id, "fork"); err != nil {
		return VolumeInfo{}, err
	}
	gen, err := n.snapshotGen(ctx, req.Source, req.Snapshot)
	if err != nil {
		return VolumeInfo{}, err
	}
	if err := n.d.Volumes.Fork(ctx, req.Source, gen, id); err != nil {
		return VolumeInfo{}, err
	}
	h, err := n.d.Volumes.Publish(ctx, id, journal.VolumeHead{}, journal.VolumeHead{Generation: 0, Node: n.d.NodeID})
	if err != nil {
		return VolumeInfo{}, err
	}
	if err := n.marks().Note(writers.SandboxVolume(id), h); err != nil {
		return VolumeInfo{}, op.TxErr("journal the head mark of "+id, err)
	}
	n.d.Log.Info("forked", "sandbox", id, "source", req.Source, "snapshot", req.Snapshot, "source_generation", gen)
	return n.Volume(ctx, id)
}

// Restore moves id's head to its snapshot (compare-and-swap over the head
// read here).
func (n *Root) Restore(ctx context.Context, id, snapshot string) (VolumeInfo, error) {
	return volumeCall(n, ctx, id, "restore", func(ctx context.Context) (VolumeInfo, error) { return n.restore(ctx, id, snapshot) })
}

func (n *Root) restore(ctx context.Context, id, snapshot string) (VolumeInfo, error) {
	if err := n.notRunning(id, "restore"); err != nil {
		return VolumeInfo{}, err
	}
	gen, err := n.snapshotGen(ctx, id, snapshot)
	if err != nil {
		return VolumeInfo{}, err
	}
	h, err := n.d.Volumes.Head(ctx, id)
	if err != nil {
		return VolumeInfo{}, errdefs.Errorf(errdefs.CodeUnavailable, "head of %s: %v", id, err)
	}
	if err := n.marks().Floor(writers.SandboxVolume(id), h, journal.VolumeHead{}); err != nil {
		return VolumeInfo{}, err
	}
	nh, err := n.d.Volumes.Publish(ctx, id, h, journal.VolumeHead{Generation: gen, WriterEpoch: h.WriterEpoch, Node: n.d.NodeID})
	if err != nil {
		return VolumeInfo{}, err
	}
	if err := n.marks().Note(writers.SandboxVolume(id), nh); err != nil {
		return VolumeInfo{}, op.TxErr("journal the head mark of "+id, err)
	}
	n.d.Log.Info("restored", "sandbox", id, "snapshot", snapshot, "generation", gen)
	return n.Volume(ctx, id)
}

func (n *Root) storedAnswer(id string) (json.RawMessage, error) { return op.Stored(n.d.Journal, id) }
func (n *Root) sandbox(id string) (journal.Sandbox, error)      { return op.Sandbox(n.d.Journal, id) }
