package manager

import (
	"context"
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
