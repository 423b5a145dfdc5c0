package manager

import (
	"context"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
)

// TestPauseResume: a pause is recorded as a release with a judged proof
// and records the head the node published; a resume claims the next
// generation with the last claim's spec; an overlay sandbox does not
// resume.
func TestPauseResume(t *testing.T) {
	ctx := context.Background()
	m, _ := setup(t)
	spec := testSpec()
	spec.RootFS = api.RootFS{Mode: api.RootFSBlock, Template: "busybox"}
	if _, err := m.Create(ctx, "sb1", spec); err != nil {
		t.Fatal(err)
	}
	p, err := m.Pause(ctx, "sb1")
	if err != nil || !p.Verdict.OK() || p.Head.Seq != 1 || p.Sandbox.State != api.StateReleased {
		t.Fatalf("pause = %+v, %v", p, err)
	}
	if h, err := m.Store.Head(ctx, "sb1"); err != nil || h != p.Head {
		t.Fatalf("recorded head %+v, %v; want %+v", h, err, p.Head)
	}
	if pr, err := m.Store.Proof(ctx, p.OperationID); err != nil || !pr.Verified {
		t.Fatalf("pause's proof record %+v, %v", pr, err)
	}
	r, err := m.Resume(ctx, "sb1")
	if err != nil || r.Sandbox.Generation != 2 || r.Sandbox.State != api.StateReady {
		t.Fatalf("resume = %+v, %v", r, err)
	}
	if _, err := m.Pause(ctx, "sb1"); err != nil {
		t.Fatal(err)
	}
	if h, _ := m.Store.Head(ctx, "sb1"); h.Seq != 2 {
		t.Fatalf("head after the second pause %+v", h)
	}
	// The record never moves back.
	if err := m.Store.PublishHead(ctx, "sb1", api.VolumeHead{Seq: 1, WriterEpoch: 9}); errdefs.CodeOf(err) != errdefs.CodeFenced {
		t.Errorf("publish of an older head: %v, want fenced", err)
	}
	if h, _ := m.Store.Head(ctx, "sb1"); h.Seq != 2 {
		t.Errorf("head after the fenced publish %+v", h)
	}

	if _, err := m.Create(ctx, "ov", testSpec()); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Destroy(ctx, "ov"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Resume(ctx, "ov"); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
		t.Errorf("resume of an overlay sandbox: %v, want invalid_argument", err)
	}
}

// TestClaimsCarryExpectedHeads (issue 21): every claim carries the heads
// the manager has seen as its lower bound (the node refuses a head below
// it): a resume the sandbox volume's recorded head (today's, not the
// last claim's), an attach the volume's mark, which only moves up. A
// volume the manager deleted is refused before the node is asked,
// whatever the bucket's tombstone says.
func TestClaimsCarryExpectedHeads(t *testing.T) {
	ctx := context.Background()
	m, n := setup(t)
	var sent []api.ClaimRequest
	n.FailClaim = func(req api.ClaimRequest) error { sent = append(sent, req); return nil }
	spec := testSpec()
	spec.RootFS = api.RootFS{Mode: api.RootFSBlock, Template: "busybox"}
	if _, err := m.Create(ctx, "sb1", spec); err != nil {
		t.Fatal(err)
	}
	if got := sent[len(sent)-1].RootFS.ExpectHead; got != (api.VolumeHead{}) {
		t.Fatalf("first claim expects head %+v, want none", got)
	}
	for want := uint64(1); want <= 2; want++ {
		p, err := m.Pause(ctx, "sb1")
		if err != nil || p.Head.Seq != want {
			t.Fatalf("pause %d: %+v, %v", want, p.Head, err)
		}
		if _, err := m.Resume(ctx, "sb1"); err != nil {
			t.Fatal(err)
		}
		if got := sent[len(sent)-1].RootFS.ExpectHead; got.Seq != want || got.Generation != p.Head.Generation {
			t.Fatalf("resume after pause %d expects head %+v, want %+v", want, got, p.Head)
		}
	}

	if err := m.Store.RaiseVolumeMark(ctx, "data", api.VolumeHead{Seq: 3, Generation: 2}); err != nil {
		t.Fatal(err)
	}
	if err := m.Store.RaiseVolumeMark(ctx, "data", api.VolumeHead{Seq: 2, Generation: 1}); err != nil {
		t.Fatal(err)
	}
	vspec := testSpec()
	vspec.Volumes = []api.VolumeMount{{ID: "data", Path: "/data"}}
	if _, err := m.Create(ctx, "sb2", vspec); err != nil {
		t.Fatal(err)
	}
	if got := sent[len(sent)-1].Volumes[0].ExpectHead; got != (api.VolumeHead{Seq: 3, Generation: 2}) {
		t.Fatalf("attach expects head %+v, want the mark 3 (generation 2)", got)
	}
	if _, err := m.Destroy(ctx, "sb2"); err != nil {
		t.Fatal(err)
	}

	if err := m.Store.MarkVolumeDeleted(ctx, "data"); err != nil {
		t.Fatal(err)
	}
	claims := len(sent)
	_, err := m.Create(ctx, "sb3", vspec)
	if errdefs.CodeOf(err) != errdefs.CodeConflict || !strings.Contains(err.Error(), "volume data was deleted") {
		t.Fatalf("claim of a deleted volume: %v, want conflict", err)
	}
	if len(sent) != claims {
		t.Fatal("the claim of a deleted volume reached the node")
	}
}
