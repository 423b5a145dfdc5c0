package blockroot

import (
	"context"
	"slices"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/writers"
)

// The fleet's writer fence (issue 24). A node's writer epochs count on
// that node alone (journal.Tx.NextWriterEpoch), so across nodes sharing
// one block store they do not order: a lost node's writer could publish
// over the generation that took its sandbox over elsewhere, and the head
// compare-and-swap would accept it. In a fleet the claim carries the
// database's writer epoch of its generation (RootFS.WriterEpoch: the
// generation number, which only grows per sandbox). Before its writer
// starts, the claim raises the head's writer epoch in the store to it (a
// head over the same committed generation: the files are unchanged), and
// its pause publishes under it. A late publish of an older generation is
// then refused by the store itself: its expected head is gone and its
// epoch is older. The node-local epoch still names the writer process
// (restarts, seals); only the head's epoch is the fleet's.

// headEpoch is the writer epoch rec's generation publishes heads under:
// the fleet's when its claim carries one, else its writer's.
func headEpoch(rec journal.Sandbox) uint64 {
	if rec.RootFS.WriterEpoch != 0 {
		return rec.RootFS.WriterEpoch
	}
	if rec.Block != nil {
		return rec.Block.WriterEpoch
	}
	return 0
}

// fence raises sandbox rec's head h in the shared store to the claim's
// fleet writer epoch and returns the head the generation starts from. A
// head of a newer epoch means the database gave the sandbox to a newer
// generation: fenced, nothing started. A claim without a fleet epoch and
// a head already of this epoch (a retried claim) are left as they are.
//
// A sandbox still on its template has no head to raise: a head must name
// a committed generation of the sandbox's volume. Its first generation
// needs no fence (no writer came before it); a later one (the database
// took over a generation that never paused) forks the template into the
// volume's generation 0, which copies nothing, and publishes that as the
// first head at its epoch, so the lost generation's first publish
// (expecting no head) is refused by the store too.
func (n *Root) fence(ctx context.Context, rec journal.Sandbox, h journal.VolumeHead) (journal.VolumeHead, error) {
	epoch := rec.RootFS.WriterEpoch
	if epoch == 0 || !n.durable {
		return h, nil
	}
	if h.WriterEpoch > epoch {
		return h, errdefs.Errorf(errdefs.CodeFenced, "claim of sandbox %s at writer epoch %d: its head %d is of writer epoch %d (a newer generation holds the sandbox)",
			rec.ID, epoch, h.Seq, h.WriterEpoch)
	}
	if h.Seq > 0 && h.WriterEpoch == epoch {
		return h, nil
	}
	if h.Seq == 0 {
		if epoch == 1 {
			return h, nil
		}
		ok, err := n.forkTemplate(ctx, rec)
		if err != nil || !ok {
			return h, err
		}
	}
	nh, err := n.d.Volumes.Publish(ctx, rec.ID, h, journal.VolumeHead{Generation: h.Generation, WriterEpoch: epoch, Node: n.d.NodeID})
	if err != nil {
		if errdefs.CodeOf(err) == errdefs.CodeFenced {
			return h, err
		}
		return h, errdefs.Errorf(errdefs.CodeUnavailable, "raise the head of sandbox %s to writer epoch %d: %v", rec.ID, epoch, err)
	}
	if err := n.marks().Note(writers.SandboxVolume(rec.ID), nh); err != nil {
		return nh, errdefs.Errorf(errdefs.CodeUnavailable, "journal the head mark of %s: %v", rec.ID, err)
	}
	n.d.Log.Info("fenced the head at the fleet's writer epoch", "sandbox", rec.ID, "generation", rec.Generation, "head", nh.Seq,
		"block_generation", nh.Generation, "writer_epoch", epoch)
	return nh, nil
}

// forkTemplate makes generation 0 of rec's headless volume its
// template's generation (a retried claim finds it made). Generations
// other than 0 with no head are a lost writer's seal that never
// published: nothing can be forked under them, so the claim goes on
// fenced by the database alone (false, logged).
func (n *Root) forkTemplate(ctx context.Context, rec journal.Sandbox) (bool, error) {
	gens, err := n.d.Volumes.Generations(ctx, rec.ID)
	if err != nil {
		return false, errdefs.Errorf(errdefs.CodeUnavailable, "generations of sandbox %s's volume: %v", rec.ID, err)
	}
	switch {
	case slices.Contains(gens, 0):
		return true, nil
	case len(gens) > 0:
		n.d.Log.Warn("no store fence for a sandbox with unpublished generations and no head; the database fences it",
			"sandbox", rec.ID, "generation", rec.Generation, "block_generations", gens)
		return false, nil
	}
	base, _, err := n.d.Templates.Template(ctx, rec.RootFS.Template)
	if err != nil {
		return false, errdefs.Errorf(errdefs.CodeUnavailable, "block template %q of sandbox %s: %v", rec.RootFS.Template, rec.ID, err)
	}
	if err := n.d.Volumes.ForkFrom(ctx, base, rec.ID); err != nil {
		// A conflict (a volume deleted by `store forget`, or a fork that
		// raced) stays one; anything else is the store being unavailable.
		code := errdefs.CodeOf(err)
		if code != errdefs.CodeConflict {
			code = errdefs.CodeUnavailable
		}
		return false, errdefs.Errorf(code, "fork %s into sandbox %s's volume to fence it: %v", base, rec.ID, err)
	}
	return true, nil
}
