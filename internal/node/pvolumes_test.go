package node

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// volumeReq is claimReq attaching persistent volume id at path.
func volumeReq(op string, gen uint64, id, path string) api.ClaimRequest {
	req := claimReq(op, gen)
	req.Volumes = []api.VolumeMount{{ID: id, Path: path}}
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
	if len(resp.Sandbox.Volumes) != 1 || resp.Sandbox.Volumes[0] != (api.VolumeMount{ID: "data", Path: "/data"}) {
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
		req  api.ClaimRequest
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
