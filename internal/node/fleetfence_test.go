package node

import (
	"context"
	"testing"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/fakekernel"
)

// sharedSeal seals on its own kernel's writer and commits the generation
// in the shared store's kernel too (two nodes, one block store).
type sharedSeal struct {
	own   *fakekernel.Sealer
	store *fakekernel.Kernel
	id    string
}

func (s sharedSeal) Seal(ctx context.Context, dir string, generation, epoch uint64) (journal.SealResult, error) {
	res, err := s.own.Seal(ctx, dir, generation, epoch)
	if err != nil {
		return res, err
	}
	return res, s.store.Commit(s.id, res.Generation, "seal of "+dir+" on another node")
}

// fleetReq is a block claim of generation gen carrying the fleet's
// writer epoch (the database's: the generation) and the head the
// database recorded.
func fleetReq(op string, gen uint64, expect journal.VolumeHead) journal.ClaimRequest {
	req := blockReq(op, gen)
	req.RootFS.WriterEpoch, req.RootFS.ExpectHead = gen, journal.VolumeHead{Seq: expect.Seq, Generation: expect.Generation}
	return req
}

// TestFleetFenceRefusesLostNodesPublish (issue 24): two nodes (two fake
// kernels) share one block store and count their own writer epochs, so the lost node's
// writer epoch can be the higher. Node A runs generation 2 of a sandbox
// from head 1; the database takes it over to generation 3 on node B from
// that head. B's claim raises the head to its fleet writer epoch before
// its writer starts, so A's late pause (its seal and publish over head 1)
// is refused by the store's compare-and-swap itself and the head stays
// B's; B's own pause publishes on. Without the fence A's publish was
// accepted (head 2 by the lost generation) and B's pause was fenced.
func TestFleetFenceRefusesLostNodesPublish(t *testing.T) {
	tk, k := blockKernel(t)
	a := newRig(t, tk)
	a.mustBoot()
	a.mustClaim(sb, fleetReq("c1", 1, journal.VolumeHead{}))
	h1 := a.mustPause(sb, "p1").Head
	if h1.Seq != 1 || h1.WriterEpoch != 1 {
		t.Fatalf("first pause's head %+v: want seq 1 at the fleet's writer epoch 1", h1)
	}
	// A's local writer epochs run ahead of B's (a busier node).
	for i := 0; i < 5; i++ {
		if err := a.j.Update(func(tx *journal.Tx) error { _, err := tx.NextWriterEpoch(); return err }); err != nil {
			t.Fatal(err)
		}
	}
	a.mustClaim(sb, fleetReq("c2", 2, h1))
	onA := a.sandbox(sb)
	if onA.Block.BaseGeneration != h1.Generation {
		t.Fatalf("generation 2 on A starts from block generation %d, want %d", onA.Block.BaseGeneration, h1.Generation)
	}

	// A is lost; the database resumes the sandbox on B from head 1 at
	// generation 3. B's journal never saw the volume.
	tkB, kB := blockKernel(t)
	tkB.volumes, tkB.sealer = k.Volumes(), sharedSeal{own: kB.Sealer(), store: k, id: sb}
	b := newRig(t, tkB)
	b.mustBoot()
	b.mustClaim(sb, fleetReq("c3", 3, h1))
	onB := b.sandbox(sb)
	if onB.Block.WriterEpoch >= onA.Block.WriterEpoch {
		t.Fatalf("B's local writer epoch %d is not below A's %d: the test shows nothing", onB.Block.WriterEpoch, onA.Block.WriterEpoch)
	}
	if onB.Block.BaseGeneration != h1.Generation || onB.Block.Head.WriterEpoch != 3 {
		t.Errorf("generation 3 on B: base %d, head %+v; want block generation %d under writer epoch 3", onB.Block.BaseGeneration, onB.Block.Head, h1.Generation)
	}
	fenced, _ := k.Volumes().Head(context.Background(), sb)

	// A comes back and pauses its stale generation: the store refuses.
	_, err, _ := a.pauseSandbox(sb, "p2")
	if errdefs.CodeOf(err) != errdefs.CodeFenced {
		t.Fatalf("the lost node's late pause: %v, want fenced by the head", err)
	}
	if h, _ := k.Volumes().Head(context.Background(), sb); h != fenced {
		t.Fatalf("head after the lost node's pause %+v, want B's %+v", h, fenced)
	}
	// Even over the head it now reads, A's epoch is older.
	if _, err := k.Volumes().Publish(context.Background(), sb, fenced, journal.VolumeHead{Generation: h1.Generation, WriterEpoch: 2, Node: "a"}); errdefs.CodeOf(err) != errdefs.CodeFenced {
		t.Fatalf("a publish at writer epoch 2 over B's head: %v, want fenced", err)
	}
	a.mustRelease(sb, "r2", 2)
	a.checkClean("after the stale generation's release")

	h3 := b.mustPause(sb, "p3").Head
	if h3.Seq != fenced.Seq+1 || h3.WriterEpoch != 3 {
		t.Fatalf("B's pause published %+v, want seq %d at writer epoch 3", h3, fenced.Seq+1)
	}
	// A stale claim (a generation the database took away, on a third
	// node) starts nothing.
	tkC, kC := blockKernel(t)
	tkC.volumes, tkC.sealer = k.Volumes(), sharedSeal{own: kC.Sealer(), store: k, id: sb}
	c := newRig(t, tkC)
	c.mustBoot()
	if _, err, _ := c.claim(sb, fleetReq("c2b", 2, h1)); errdefs.CodeOf(err) != errdefs.CodeFenced {
		t.Fatalf("a claim at writer epoch 2 over head %+v: %v, want fenced", h3, err)
	}
	c.checkClean("after the refused stale claim")
	b.checkClean("after B's pause")
}

// TestFleetFenceNeverPausedSandbox (issue 24): a block sandbox that never
// paused has no head to raise. Its first generation runs on node A and
// is lost; the database resumes it from its template as generation 2 on
// node B. B's claim forks the template into the volume's generation 0
// and publishes it as the first head at writer epoch 2, so A's late pause
// (a publish expecting no head) is refused by the store itself; B's own
// pause publishes on. Without the fork A's publish was accepted.
func TestFleetFenceNeverPausedSandbox(t *testing.T) {
	tk, k := blockKernel(t)
	a := newRig(t, tk)
	a.mustBoot()
	a.mustClaim(sb, fleetReq("c1", 1, journal.VolumeHead{}))
	if h, _ := k.Volumes().Head(context.Background(), sb); h.Seq != 0 {
		t.Fatalf("head after the first generation's claim %+v: the first generation needs no fence", h)
	}

	tkB, kB := blockKernel(t)
	tkB.volumes, tkB.sealer = k.Volumes(), sharedSeal{own: kB.Sealer(), store: k, id: sb}
	b := newRig(t, tkB)
	b.mustBoot()
	b.mustClaim(sb, fleetReq("c2", 2, journal.VolumeHead{}))
	fenced, _ := k.Volumes().Head(context.Background(), sb)
	if fenced.Seq != 1 || fenced.Generation != 0 || fenced.WriterEpoch != 2 {
		t.Fatalf("head after the takeover's claim %+v: want seq 1 naming the template's fork (block generation 0) at writer epoch 2", fenced)
	}
	if gens, _ := k.Volumes().Generations(context.Background(), sb); len(gens) != 1 || gens[0] != 0 {
		t.Fatalf("the volume's generations after the takeover's claim %v: want the fork [0]", gens)
	}
	// A retried claim of the same generation forks and publishes nothing more.
	b.mustClaim(sb, fleetReq("c2", 2, journal.VolumeHead{}))
	if h, _ := k.Volumes().Head(context.Background(), sb); h != fenced {
		t.Fatalf("head after the retried claim %+v, want %+v", h, fenced)
	}

	_, err, _ := a.pauseSandbox(sb, "p1")
	if errdefs.CodeOf(err) != errdefs.CodeFenced {
		t.Fatalf("the lost node's late pause of its never-paused generation: %v, want fenced by the head", err)
	}
	if h, _ := k.Volumes().Head(context.Background(), sb); h != fenced {
		t.Fatalf("head after the lost node's pause %+v, want B's %+v", h, fenced)
	}
	a.mustRelease(sb, "r1", 1)
	a.checkClean("after the stale generation's release")

	h2 := b.mustPause(sb, "p2").Head
	if h2.Seq != fenced.Seq+1 || h2.WriterEpoch != 2 {
		t.Fatalf("B's pause published %+v, want seq %d at writer epoch 2", h2, fenced.Seq+1)
	}
	b.checkClean("after B's pause")
}
