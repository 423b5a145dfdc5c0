package node

import (
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
)

// rolledBack asserts a claim refused as a rolled-back head, with nothing
// journaled for its generation.
func rolledBack(t *testing.T, r *rig, req journal.ClaimRequest, who string) {
	t.Helper()
	_, err, returned := r.claim(sb, req)
	if !returned || errdefs.CodeOf(err) != errdefs.CodeConflict || !strings.Contains(err.Error(), "rolled back") || !strings.Contains(err.Error(), who) {
		t.Fatalf("claim %s over a rolled-back head: %v, want a conflict from %s", req.OperationID, err, who)
	}
	err = r.j.View(func(tx *journal.Tx) error {
		if s, ok, err := tx.Sandbox(sb); err != nil || ok && s.Generation == req.Generation {
			t.Errorf("the refused claim left generation %d in the journal (%s, %v)", s.Generation, s.State, err)
		}
		if _, ok, _ := tx.Operation(req.OperationID); ok {
			t.Errorf("the refused claim journaled its operation %s", req.OperationID)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	r.checkClean("after the refused claim " + req.OperationID)
}

// TestResumeRefusesRolledBackHead (issue 21): a bucket that lost its
// newest head (deleted, or an older head object put back) or every head
// makes a resume start from an older disk. ctld's own high-water mark of
// the volume (journaled, so it survives a failover) refuses it with a
// conflict and starts nothing; the claim's expected head (the manager's
// record) refuses it even on a node whose journal never saw the volume.
// Once the bucket has its head back, the resume runs from it: nothing
// lost.
func TestResumeRefusesRolledBackHead(t *testing.T) {
	tk, k := blockKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	r.mustClaim(sb, blockReq("c1", 1))
	h1 := r.mustPause(sb, "p1").Head
	r.mustClaim(sb, blockReq("c2", 2))
	h2 := r.mustPause(sb, "p2").Head
	if h1.Seq != 1 || h2.Seq != 2 {
		t.Fatalf("heads %+v, %+v", h1, h2)
	}

	k.SetHead(sb, h1) // head 2 deleted, or head 1 put back
	rolledBack(t, r, blockReq("c3", 3), "this node's journal")
	r.mustBoot() // failover: the mark is in the journal
	rolledBack(t, r, blockReq("c3b", 3), "this node's journal")
	k.SetHead(sb, journal.VolumeHead{}) // every head deleted
	rolledBack(t, r, blockReq("c3c", 3), "this node's journal")

	// The manager's expected head, on a node that never saw the volume:
	// a fresh journal has no mark.
	r2 := newRig(t, tk)
	r2.mustBoot()
	k.SetHead(sb, h1)
	req := blockReq("c4", 3)
	req.RootFS.ExpectHead = journal.VolumeHead{Seq: h2.Seq, Generation: h2.Generation}
	rolledBack(t, r2, req, "the claim")
	req = blockReq("c4b", 3)
	req.RootFS.ExpectHead = journal.VolumeHead{Seq: h1.Seq, Generation: h1.Generation + 5}
	rolledBack(t, r2, req, "the claim")

	// The bucket repaired: the resume runs from head 2.
	k.SetHead(sb, h2)
	req = blockReq("c5", 3)
	req.RootFS.ExpectHead = journal.VolumeHead{Seq: h2.Seq, Generation: h2.Generation}
	r.mustClaim(sb, req)
	if s := r.sandbox(sb); s.Block.Head.Seq != 2 || s.Block.BaseGeneration != h2.Generation {
		t.Fatalf("resumed over %+v from generation %d, want head 2", s.Block.Head, s.Block.BaseGeneration)
	}
}

// TestVolumeAttachRefusesRolledBackHead (issue 21): as for a sandbox's
// volume, a persistent volume's attach is refused below the node's mark
// (the head its detach published) and below the claim's expected head;
// a volume with every head gone (deleted tombstone and heads, or heads
// deleted) is a conflict too, never a fresh start.
func TestVolumeAttachRefusesRolledBackHead(t *testing.T) {
	tk, k := fakeKernel(t)
	k.CreateVolume("data")
	r := newRig(t, tk)
	r.mustBoot()
	h1 := k.VolumeHead("data")
	r.mustClaim(sb, volumeReq("c1", 1, "data", "/data"))
	rel := r.mustRelease(sb, "r1", 1)
	h2 := k.VolumeHead("data")
	if h2.Seq != h1.Seq+1 {
		t.Fatalf("head after the detach %+v, want one past %+v", h2, h1)
	}
	if v := rel.Sandbox.Volumes; len(v) != 1 || v[0].Published == nil || v[0].Published.Seq != h2.Seq {
		t.Fatalf("the release's sandbox shows volumes %+v, want the published head %d", v, h2.Seq)
	}

	k.SetVolumeHead("data", h1)
	rolledBack(t, r, volumeReq("c2", 2, "data", "/data"), "this node's journal")
	r.mustBoot()
	k.SetVolumeHead("data", journal.VolumeHead{})
	rolledBack(t, r, volumeReq("c2b", 2, "data", "/data"), "this node's journal")

	r2 := newRig(t, tk)
	r2.mustBoot()
	k.SetVolumeHead("data", h1)
	req := volumeReq("c3", 1, "data", "/data")
	req.Volumes[0].ExpectHead = journal.VolumeHead{Seq: h2.Seq, Generation: h2.Generation}
	_, err, _ := r2.claim("other", req)
	if errdefs.CodeOf(err) != errdefs.CodeConflict || !strings.Contains(err.Error(), "the claim") {
		t.Fatalf("attach below the claim's expected head: %v, want conflict", err)
	}

	k.SetVolumeHead("data", h2)
	r.mustClaim(sb, volumeReq("c4", 2, "data", "/data"))
	if s := r.sandbox(sb); len(s.Volumes) != 1 || s.Volumes[0].Head.Seq != h2.Seq {
		t.Fatalf("attach over %+v, want head %d", s.Volumes, h2.Seq)
	}
}
