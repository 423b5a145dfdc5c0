package node

import (
	"context"
	"strconv"
	"testing"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/blockvol"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/rootfs"
	"github.com/ctld/ctld/internal/writer"
)

// TestKernelPauseCrashPoints: on the real kernel (runsc guests on block
// roots, `ctld writer` processes, a directory block store), a pause with
// no crash publishes head 1 and the resumed generation reads the file
// written before it; a primary killed after the seal (before the publish)
// leaves the head as it was, the next one thaws the root and adopts the
// running generation, whose release is clean; killed after the publish,
// the next one completes the pause (released as paused, head 1). Every
// case ends with nothing left: no writer, device, mount, cgroup or
// process (checkClean and the leak check).
func TestKernelPauseCrashPoints(t *testing.T) {
	ktest.Require(t)
	store := newRealBlockStore(t)
	for i, point := range []string{"", "pause:sealed", "pause:published"} {
		name := point
		if name == "" {
			name = "none"
		}
		t.Run(subtestName(name), func(t *testing.T) {
			k := realBlockKernel(t, store)
			k.noReuse = true
			k.volumes = blockvol.Volumes{Repo: store.templates.repo}
			k.sealer = blockvol.Sealer{Supervisor: k.block.(*writer.Supervisor)}
			k.freezer = k.blockMounts.(*rootfs.Block)
			id := "pz" + strconv.Itoa(i)
			r := newRig(t, k)
			r.mustBoot()
			r.mustClaim(id, claimReq("c1", 1))
			ctx, cancel := r.ctx()
			defer cancel()
			if err := r.n.WriteFile(ctx, id, "/kept", []byte("before the pause\n")); err != nil {
				t.Fatalf("write /kept: %v", err)
			}
			vol := blockstore.Sandbox(id)
			r.arm(point)
			resp, err, returned := r.pauseSandbox(id, "p1")
			switch {
			case point == "":
				if !returned || err != nil || resp.Head.Seq != 1 || !resp.Proof.Clean {
					t.Fatalf("pause: returned %v, %v, head %+v, proof %+v", returned, err, resp.Head, resp.Proof.Checks)
				}
				t.Logf("pause: block generation %d, %d chunks (%d bytes), frozen %.0f ms, writer barrier %.0f ms, total %.0f ms",
					resp.Seal.Generation, resp.Seal.Chunks, resp.Seal.Bytes, resp.Seal.FreezeMS, resp.Seal.BarrierMS, resp.Seal.TotalMS)
				r.checkClean("after the pause")
				r.mustClaim(id, claimReq("c2", 2))
				if s := r.sandbox(id); s.Block == nil || s.Block.BaseVolume != vol.String() || s.Block.BaseGeneration != resp.Head.Generation {
					t.Fatalf("resumed generation's block record %+v: want base %s@%d", s.Block, vol, resp.Head.Generation)
				}
				got, err := r.n.ReadFile(ctx, id, "/kept", 1<<20)
				if err != nil || string(got) != "before the pause\n" {
					t.Fatalf("/kept after the resume: %q, %v", got, err)
				}
				r.mustRelease(id, "r2", 2)
			case returned:
				t.Fatalf("pause returned (%v) without reaching %s", err, point)
			case point == "pause:sealed":
				r.mustBoot()
				s := r.sandbox(id)
				if s.State != journal.StateReady || s.Seal == nil || s.Seal.State != journal.SealAbandoned {
					t.Fatalf("after takeover: %s (%s), seal %+v; want ready, abandoned", s.State, s.Reason, s.Seal)
				}
				if h, err := store.templates.repo.Head(context.Background(), vol); err != nil || h.Seq != 0 {
					t.Fatalf("head after a pause that did not publish: %+v, %v", h, err)
				}
				// The root was thawed: the guest writes.
				if err := r.n.WriteFile(ctx, id, "/after", []byte("x")); err != nil {
					t.Fatalf("write after the takeover: %v", err)
				}
				r.mustRelease(id, "r1", 1)
			case point == "pause:published":
				r.mustBoot()
				s := r.sandbox(id)
				if s.State != journal.StateReleased || s.Reason != "paused" {
					t.Fatalf("after takeover: %s (%s), want released as paused", s.State, s.Reason)
				}
				if h, err := store.templates.repo.Head(context.Background(), vol); err != nil || h.Seq != 1 {
					t.Fatalf("head after a published pause: %+v, %v", h, err)
				}
				r.checkProof("p1")
			}
			r.checkClean("at the end")
		})
	}
}
