package node

import (
	"context"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
)

func (r *rig) pauseSandbox(id, op string) (resp answer, err error, returned bool) {
	ctx, cancel := r.ctx()
	defer cancel()
	returned = r.do(func() { resp, err = decodeAnswer(r.n.Pause(ctx, id, PauseRequest{OperationID: op})) })
	return resp, err, returned
}

func (r *rig) mustPause(id, op string) answer {
	r.t.Helper()
	resp, err, returned := r.pauseSandbox(id, op)
	if !returned || err != nil {
		r.t.Fatalf("pause %s %s: returned %v (crash at %q), %v", id, op, returned, r.lastCrash(), err)
	}
	return resp
}

// volCalls keeps the block volume calls of the fake kernel's log.
func volCalls(calls []string) []string {
	var out []string
	for _, c := range calls {
		for _, p := range []string{"freeze ", "seal ", "thaw ", "publish ", "snapshot ", "fork "} {
			if strings.HasPrefix(c, p) {
				out = append(out, c)
			}
		}
	}
	return out
}

// TestPauseResume: a pause freezes the root, seals the device as the
// volume's next generation, thaws, publishes the head over the one the
// claim started from, and releases the generation with a clean proof; the
// next claim starts its writer over the head (a resume), and its pause
// publishes the next head. A repeated pause operation answers the same.
func TestPauseResume(t *testing.T) {
	tk, k := blockKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	r.mustClaim(sb, blockReq("c1", 1))
	first := r.sandbox(sb)
	if first.Block.BaseVolume != "templates/busybox" || first.Block.Head.Seq != 0 {
		t.Fatalf("fresh claim's block record %+v: want the template's base and no head", first.Block)
	}
	k.Calls()
	resp := r.mustPause(sb, "p1")
	cid := first.ContainerID
	want := []string{
		"freeze " + cid, "seal " + cid + " generation 1 epoch " + itoa(first.Block.WriterEpoch), "thaw " + cid,
		"publish " + sb + " head 1 generation 1 epoch " + itoa(first.Block.WriterEpoch),
	}
	if got := volCalls(k.Calls()); !reflect.DeepEqual(got, want) {
		t.Fatalf("pause's calls %q, want %q", got, want)
	}
	if resp.Head.Seq != 1 || resp.Head.Generation != 1 || resp.Seal.Generation != 1 || resp.Sandbox.State != journal.StateReleased || resp.Sandbox.Reason != "paused" {
		t.Fatalf("pause answer: head %+v seal %+v sandbox %s (%s)", resp.Head, resp.Seal, resp.Sandbox.State, resp.Sandbox.Reason)
	}
	if resp.Sandbox.Seal == nil || resp.Sandbox.Seal.State != journal.SealPublished || !resp.Proof.Clean {
		t.Fatalf("pause status %+v, proof clean %v", resp.Sandbox.Seal, resp.Proof.Clean)
	}
	r.checkProof("p1")
	r.checkClean("after the pause")
	if again := r.mustPause(sb, "p1"); !reflect.DeepEqual(again, resp) {
		t.Errorf("repeated pause answered %+v, want %+v", again, resp)
	}

	r.mustClaim(sb, blockReq("c2", 2))
	second := r.sandbox(sb)
	if second.Block.BaseVolume != "sandboxes/"+sb || second.Block.BaseGeneration != 1 || second.Block.Head.Seq != 1 {
		t.Fatalf("resumed claim's block record %+v: want base sandbox/%s@1 and head 1", second.Block, sb)
	}
	resp2 := r.mustPause(sb, "p2")
	if resp2.Head.Seq != 2 || resp2.Head.Generation != 2 || resp2.Head.WriterEpoch != second.Block.WriterEpoch {
		t.Fatalf("second pause's head %+v", resp2.Head)
	}
	r.checkClean("after the second pause")
}

func itoa(v uint64) string { return strconv.FormatUint(v, 10) }

// TestPauseFencedKeepsRunning: when the head moved since the claim
// started (another writer published), the pause is fenced: nothing is
// released, the generation keeps running, its record says the pause was
// abandoned, and a release still ends it cleanly.
func TestPauseFencedKeepsRunning(t *testing.T) {
	tk, k := blockKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	r.mustClaim(sb, blockReq("c1", 1))
	// Another writer (say, a stale node) committed and published meanwhile.
	if _, err := k.Sealer().Seal(context.Background(), r.sandbox(sb).Block.Dir, 7, r.sandbox(sb).Block.WriterEpoch); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Volumes().Publish(context.Background(), sb, journal.VolumeHead{}, journal.VolumeHead{Generation: 7, WriterEpoch: 99}); err != nil {
		t.Fatal(err)
	}
	_, err, _ := r.pauseSandbox(sb, "p1")
	if errdefs.CodeOf(err) != errdefs.CodeFenced {
		t.Fatalf("pause after the head moved: %v, want fenced", err)
	}
	s := r.sandbox(sb)
	if s.State != journal.StateReady || s.Seal == nil || s.Seal.State != journal.SealAbandoned {
		t.Fatalf("after the fenced pause: %s, seal %+v; want ready and abandoned", s.State, s.Seal)
	}
	if h, _ := k.Volumes().Head(context.Background(), sb); h.Seq != 1 || h.Generation != 7 {
		t.Errorf("head after the fenced pause %+v, want the other writer's", h)
	}
	if _, err := r.n.Pause(context.Background(), sb, PauseRequest{OperationID: "p1"}); errdefs.CodeOf(err) != errdefs.CodeFenced {
		t.Errorf("retry of the fenced pause: %v, want its recorded fenced error", err)
	}
	r.mustRelease(sb, "r1", 1)
	r.checkClean("after the release")
}

// TestPauseCrashPoints: a primary killed after the seal and before the
// publish leaves the head as it was; the takeover marks the pause
// abandoned and adopts the running generation. Killed after the publish,
// the takeover completes the pause: the generation is released as paused
// under the pause's operation.
func TestPauseCrashPoints(t *testing.T) {
	t.Run("sealed", func(t *testing.T) {
		tk, k := blockKernel(t)
		r := newRig(t, tk)
		r.mustBoot()
		r.mustClaim(sb, blockReq("c1", 1))
		r.arm("pause:sealed")
		if _, _, returned := r.pauseSandbox(sb, "p1"); returned {
			t.Fatal("pause did not reach pause:sealed")
		}
		r.mustBoot()
		s := r.sandbox(sb)
		if s.State != journal.StateReady || s.Seal == nil || s.Seal.State != journal.SealAbandoned {
			t.Fatalf("after takeover: %s (%s), seal %+v; want ready, abandoned", s.State, s.Reason, s.Seal)
		}
		if h, _ := k.Volumes().Head(context.Background(), sb); h.Seq != 0 {
			t.Errorf("head %+v after a pause that never published", h)
		}
		if _, err := r.n.Pause(context.Background(), sb, PauseRequest{OperationID: "p1"}); errdefs.CodeOf(err) != errdefs.CodeUnavailable || !strings.Contains(err.Error(), "before its head was published") {
			t.Errorf("the interrupted pause answers %v", err)
		}
		// A new pause works from the same head.
		if resp := r.mustPause(sb, "p2"); resp.Head.Seq != 1 {
			t.Errorf("pause after the abandoned one: head %+v", resp.Head)
		}
		r.checkClean("after the second pause")
	})
	t.Run("published", func(t *testing.T) {
		tk, k := blockKernel(t)
		r := newRig(t, tk)
		r.mustBoot()
		r.mustClaim(sb, blockReq("c1", 1))
		r.arm("pause:published")
		if _, _, returned := r.pauseSandbox(sb, "p1"); returned {
			t.Fatal("pause did not reach pause:published")
		}
		r.mustBoot()
		s := r.sandbox(sb)
		if s.State != journal.StateReleased || s.Reason != "paused" || s.Seal == nil || s.Seal.State != journal.SealPublished {
			t.Fatalf("after takeover: %s (%s), seal %+v; want released as paused", s.State, s.Reason, s.Seal)
		}
		if h, _ := k.Volumes().Head(context.Background(), sb); h.Seq != 1 {
			t.Errorf("head %+v, want the published one", h)
		}
		resp, err := decodeAnswer(r.n.Pause(context.Background(), sb, PauseRequest{OperationID: "p1"}))
		if err != nil || resp.Head.Seq != 1 || !resp.Proof.Clean {
			t.Errorf("the completed pause answers %+v, %v", resp, err)
		}
		r.checkClean("after the completed pause")
	})
}

// TestSnapshotForkRestore: a snapshot seals while the generation keeps
// running and names the generation (a taken name is a conflict before
// anything is frozen); a fork makes a new identity whose head is its
// generation 0 over the snapshot, and its claim starts there; restore
// moves a stopped sandbox's head to a snapshot and is refused while a
// generation runs.
func TestSnapshotForkRestore(t *testing.T) {
	tk, k := blockKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	r.mustClaim(sb, blockReq("c1", 1))
	ctx := context.Background()
	snap, _, err := r.n.Snapshot(ctx, sb, "s1")
	if err != nil || snap.Generation != 1 {
		t.Fatalf("snapshot: %+v, %v", snap, err)
	}
	if s := r.sandbox(sb); s.State != journal.StateReady || s.Block.BaseGeneration != 1 {
		t.Fatalf("after the snapshot: %s, base %+v; want ready, rebased onto generation 1", s.State, s.Block)
	}
	k.Calls()
	if _, _, err := r.n.Snapshot(ctx, sb, "s1"); errdefs.CodeOf(err) != errdefs.CodeConflict {
		t.Errorf("snapshot of a taken name: %v, want conflict", err)
	}
	if calls := volCalls(k.Calls()); len(calls) != 0 {
		t.Errorf("the refused snapshot did %q", calls)
	}
	if _, err := r.n.Restore(ctx, sb, "s1"); errdefs.CodeOf(err) != errdefs.CodeConflict {
		t.Errorf("restore while running: %v, want conflict", err)
	}
	const fork = "sb-fork"
	v, err := r.n.Fork(ctx, fork, ForkRequest{Source: sb, Snapshot: "s1"})
	if err != nil || v.Head.Seq != 1 || v.Head.Generation != 0 {
		t.Fatalf("fork: %+v, %v", v, err)
	}
	if _, err := r.n.Fork(ctx, fork, ForkRequest{Source: sb, Snapshot: "s1"}); errdefs.CodeOf(err) != errdefs.CodeConflict {
		t.Errorf("second fork onto the same identity: %v, want conflict", err)
	}
	if _, err := r.n.Fork(ctx, "sb-x", ForkRequest{Source: sb, Snapshot: "nosuch"}); errdefs.CodeOf(err) != errdefs.CodeNotFound {
		t.Errorf("fork of a missing snapshot: %v, want not_found", err)
	}
	r.mustClaim(fork, blockReq("f1", 1))
	if b := r.sandbox(fork).Block; b.BaseVolume != "sandboxes/"+fork || b.BaseGeneration != 0 || b.Head.Seq != 1 {
		t.Fatalf("the fork's claim: block %+v, want base sandbox/%s@0", b, fork)
	}
	r.mustPause(sb, "p1")
	v, err = r.n.Restore(ctx, sb, "s1")
	if err != nil || v.Head.Seq != 2 || v.Head.Generation != 1 {
		t.Fatalf("restore: %+v, %v", v, err)
	}
	r.mustRelease(fork, "rf", 1)
	r.checkClean("after the fork's release")
}
