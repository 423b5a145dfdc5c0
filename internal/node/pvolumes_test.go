package node

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// volumeReq is claimReq attaching persistent volume id at path.
func volumeReq(op string, gen uint64, id, path string) journal.ClaimRequest {
	req := claimReq(op, gen)
	req.Volumes = []journal.VolumeMount{{ID: id, Path: path}}
	return req
}

// volumeCheck is the detail of the proof's volumes_detached check of op.
func volumeCheck(t *testing.T, r *rig, op string) string {
	t.Helper()
	for _, c := range r.checkProof(op).Checks {
		if c.Name == "volumes_detached" {
			if !c.OK {
				t.Errorf("proof of %s: volumes_detached failed: %s", op, c.Detail)
			}
			return c.Detail
		}
	}
	t.Fatalf("proof of %s has no volumes_detached check", op)
	return ""
}

// TestVolumeAttachDetach: a claim attaches a persistent volume (writer of
// a journaled epoch over the volume's head, its device mounted, the mount
// bound into the bundle at the path); a second sandbox naming the volume
// is refused while the first holds it, and so is a volume that does not
// exist, before anything is journaled. The release seals the device and
// publishes it as the volume's next head over the one the attach started
// from (the proof says which), and leaves nothing. A later sandbox
// attaches the volume over that head.
func TestVolumeAttachDetach(t *testing.T) {
	tk, k := fakeKernel(t)
	k.CreateVolume("data")
	r := newRig(t, tk)
	r.mustBoot()

	resp := r.mustClaim(sb, volumeReq("c1", 1, "data", "/data"))
	s := r.sandbox(sb)
	if len(s.Volumes) != 1 {
		t.Fatalf("attaches %+v, want one", s.Volumes)
	}
	av := s.Volumes[0]
	if av.ID != "data" || av.WriterEpoch == 0 || av.Index < 0 || av.Head.Seq != 1 || av.Mount != filepath.Join(k.VolumeMountDir(), "data") || av.RootDev == "" {
		t.Errorf("attach %+v: want data with an epoch, a device, head 1 and its mount", av)
	}
	if v := resp.Sandbox.Volumes; len(v) != 1 || v[0].ID != "data" || v[0].Path != "/data" || v[0].Head.Seq != 1 {
		t.Errorf("the claim's sandbox shows volumes %+v", resp.Sandbox.Volumes)
	}
	b, err := os.ReadFile(filepath.Join(r.n.bundleDir(s.ContainerID), "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	if m := spec.Mounts[len(spec.Mounts)-1]; m.Destination != "/data" || m.Source != av.Mount || m.Type != "bind" {
		t.Errorf("the bundle's last mount %+v, want the volume's bind at /data", m)
	}
	if text := k.String(); !strings.Contains(text, "volume mount data from /dev/nbd") {
		t.Errorf("kernel after the claim:\n%s", text)
	}

	for _, c := range []struct {
		req  journal.ClaimRequest
		code errdefs.Code
		want string
	}{
		{volumeReq("o1", 1, "data", "/v"), errdefs.CodeConflict, "attached to sandbox sb generation 1"},
		{volumeReq("o2", 1, "nosuch", "/v"), errdefs.CodeNotFound, `volume "nosuch" not found`},
	} {
		_, err, _ := r.claim("other", c.req)
		if errdefs.CodeOf(err) != c.code || !strings.Contains(err.Error(), c.want) {
			t.Errorf("claim of %s: %v, want %s containing %q", c.req.Volumes[0].ID, err, c.code, c.want)
		}
		if _, err := r.n.sandbox("other"); errdefs.CodeOf(err) != errdefs.CodeNotFound {
			t.Errorf("a refused claim left a record: %v", err)
		}
	}

	r.mustRelease(sb, "r1", 1)
	if d := volumeCheck(t, r, "r1"); !strings.Contains(d, "data: published head 2 (generation 1)") {
		t.Errorf("volumes_detached: %s", d)
	}
	if h := k.VolumeHead("data"); h.Seq != 2 || h.Generation != 1 || h.WriterEpoch != av.WriterEpoch {
		t.Errorf("the volume's head %+v, want head 2 over generation 1 by epoch %d", h, av.WriterEpoch)
	}
	if s := r.sandbox(sb); len(s.Volumes) != 1 || s.Volumes[0].Published == nil || s.Volumes[0].Published.Seq != 2 {
		t.Errorf("journaled attach after the release: %+v", s.Volumes)
	}
	r.checkClean("after the release")

	r.mustClaim("other", volumeReq("c2", 1, "data", "/mnt/v"))
	if av2 := r.sandbox("other").Volumes[0]; av2.Head.Seq != 2 || av2.WriterEpoch <= av.WriterEpoch {
		t.Errorf("the later attach %+v: want it over head 2 with a newer epoch", av2)
	}
	r.mustRelease("other", "r2", 1)
	volumeCheck(t, r, "r2")
	if h := k.VolumeHead("data"); h.Seq != 3 {
		t.Errorf("head after the second sandbox: %+v, want 3", h)
	}
	r.checkClean("after the second sandbox")
}

// TestVolumeFencedPublish: a detach whose publish loses the head's
// compare-and-swap (another node moved the head while the volume was
// attached here) leaves the head as the other node made it, still tears
// everything down, and says in the proof and on the journaled attach that
// this attach's writes were not published.
func TestVolumeFencedPublish(t *testing.T) {
	tk, k := fakeKernel(t)
	k.CreateVolume("data")
	r := newRig(t, tk)
	r.mustBoot()
	r.mustClaim(sb, volumeReq("c1", 1, "data", "/data"))
	k.MoveVolumeHead("data", 1<<40)
	r.mustRelease(sb, "r1", 1)
	if d := volumeCheck(t, r, "r1"); !strings.Contains(d, "data: not published") || !strings.Contains(d, "fenced") {
		t.Errorf("volumes_detached: %s; want the fenced publish reported", d)
	}
	if h := k.VolumeHead("data"); h.Seq != 2 || h.Node != "elsewhere" {
		t.Errorf("head %+v, want the other node's head 2", h)
	}
	if av := r.sandbox(sb).Volumes[0]; av.Published != nil || !strings.Contains(av.PublishError, "fenced") {
		t.Errorf("journaled attach %+v: want the publish error", av)
	}
	r.checkClean("after the fenced detach")
}

// TestVolumeSealFailureWithholds: a seal that fails (the store is down)
// fails the teardown: the writer, its dirty data and the mount are kept
// and the generation is withheld, not released with its writes lost; a
// retry once the store is back seals, publishes and ends clean.
func TestVolumeSealFailureWithholds(t *testing.T) {
	tk, k := fakeKernel(t)
	k.CreateVolume("data")
	r := newRig(t, tk)
	r.mustBoot()
	r.mustClaim(sb, volumeReq("c1", 1, "data", "/data"))
	dir := r.sandbox(sb).Volumes[0].Dir
	k.FailMake("seal", filepath.Base(dir), errSealTest)
	_, err, _ := r.release(sb, "r1", 1)
	s := r.sandbox(sb)
	if err == nil && !s.Withheld {
		t.Fatalf("release with a failing seal: %v, record %s withheld %v; want withheld", err, s.State, s.Withheld)
	}
	if text := k.String(); !strings.Contains(text, "volume mount data") || !strings.Contains(text, "writer data") {
		t.Errorf("the volume's writer and mount went with a failed seal:\n%s", text)
	}
	if h := k.VolumeHead("data"); h.Seq != 1 {
		t.Errorf("head %+v moved without a seal", h)
	}
	k.ClearFailMake("seal", filepath.Base(dir))
	r.mustBoot() // a takeover retries the withheld teardown
	if h := k.VolumeHead("data"); h.Seq != 2 {
		t.Errorf("head after the retry %+v, want 2", h)
	}
	r.checkClean("after the retry")
}

var errSealTest = errdefs.Errorf(errdefs.CodeUnavailable, "block store unreachable")

// TestVolumeWriterRestarted: a volume's writer that dies is restarted on
// the same device with a new journaled epoch over the attach's head, like
// the root's: by the writers' watch, by a takeover's reconcile, and by
// the detach if neither got to it. The generation stays ready and each
// release seals and publishes the volume's next head (no "not sealed").
func TestVolumeWriterRestarted(t *testing.T) {
	for _, mode := range kernelModes {
		t.Run(mode.name, func(t *testing.T) {
			tk, k := mode.make(t)
			k.CreateVolume("data")
			r := newRig(t, tk)
			r.mustBoot()
			ctx, cancel := context.WithCancel(context.Background())
			watched := make(chan struct{})
			go func() { defer close(watched); r.n.WatchWriters(ctx) }()

			// The watch.
			r.mustClaim(sb, volumeReq("c1", 1, "data", "/data"))
			before := r.sandbox(sb).Volumes[0]
			k.KillWriter(before.Dir)
			var s journal.Sandbox
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				if s = r.sandbox(sb); s.Volumes[0].WriterEpoch > before.WriterEpoch && s.Volumes[0].PID != before.PID {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("volume writer not restarted 5 s after its kill: %+v", s.Volumes)
				}
			}
			av := s.Volumes[0]
			if s.State != journal.StateReady || av.Index != before.Index || av.Restarts != 1 || av.Head != before.Head {
				t.Fatalf("after the watch's restart: %s (%s), attach %+v, before %+v", s.State, s.Reason, av, before)
			}
			if st, err := k.Blocks().Check(context.Background(), av.Dir); err != nil || st.Epoch != av.WriterEpoch || st.Index != av.Index {
				t.Fatalf("volume writer after the restart: %+v, %v; journal %+v", st, err, av)
			}
			if spec, _ := k.WriterSpec(av.Dir); spec.Base != (blockstore.GenRef{Volume: blockstore.Vol("data"), Generation: av.Head.Generation}) || spec.Volume != blockstore.Vol("data") || !spec.Reattach {
				t.Errorf("restarted volume writer's spec %+v: want a re-attach over the attach's head", spec)
			}
			cancel()
			<-watched

			// The takeover.
			k.KillWriter(av.Dir)
			r.mustBoot()
			s = r.sandbox(sb)
			if s.State != journal.StateReady || s.Volumes[0].WriterEpoch <= av.WriterEpoch || s.Volumes[0].Restarts != 2 || s.Volumes[0].Index != av.Index {
				t.Fatalf("after the takeover: %s (%s), attach %+v", s.State, s.Reason, s.Volumes[0])
			}
			r.mustRelease(sb, "r1", 1)
			if d := volumeCheck(t, r, "r1"); !strings.Contains(d, "data: published head 2") {
				t.Errorf("volumes_detached after two restarts: %s", d)
			}
			if h := k.VolumeHead("data"); h.Seq != 2 || h.WriterEpoch != r.sandbox(sb).Volumes[0].WriterEpoch {
				t.Errorf("head %+v: want head 2 by the restarted writer's epoch", h)
			}
			r.checkClean("after the release")

			// The detach, with no watch running.
			r.mustClaim(sb, volumeReq("c2", 2, "data", "/data"))
			k.KillWriter(r.sandbox(sb).Volumes[0].Dir)
			r.mustRelease(sb, "r2", 2)
			if d := volumeCheck(t, r, "r2"); !strings.Contains(d, "data: published head 3") {
				t.Errorf("volumes_detached of a writer dead at the detach: %s", d)
			}
			r.checkClean("after the second release")
			checkUnjournaled(r, crashCase{})
		})
	}
}

// TestVolumeUnrecordedWriterSealed: a volume writer no attach record
// names (its generation is another journal's) is sealed and published by
// the orphan sweep when its spec proves its attach and the head has not
// moved since; one whose volume's head moved is only stopped. Both leave
// nothing.
func TestVolumeUnrecordedWriterSealed(t *testing.T) {
	tk, k := fakeKernel(t)
	k.CreateVolume("data")
	orphan := func(id string) journal.AttachedVolume {
		other := newRig(t, tk)
		other.mustBoot()
		other.mustClaim(id, volumeReq("o1", 1, "data", "/data"))
		av := other.sandbox(id).Volumes[0]
		other.end()
		other.n.Close()
		return av
	}
	r := newRig(t, tk)
	av := orphan("orph")
	r.mustBoot()
	if h := k.VolumeHead("data"); h.Seq != 2 || h.WriterEpoch != av.WriterEpoch || h.Node != r.n.d.Identity.NodeID {
		t.Errorf("head %+v after the sweep: want head 2 by the orphan's writer (epoch %d)", h, av.WriterEpoch)
	}
	r.checkClean("after the sweep")

	orphan("orph2")
	k.MoveVolumeHead("data", 1<<40)
	r.mustBoot()
	if h := k.VolumeHead("data"); h.Seq != 3 || h.Node != "elsewhere" {
		t.Errorf("head %+v: a sweep published over a head that moved", h)
	}
	r.checkClean("after the second sweep")
}
