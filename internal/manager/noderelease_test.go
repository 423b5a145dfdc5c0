package manager

import (
	"context"
	"crypto/ed25519"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
)

// A release ctld made itself (on_exit release, max lifetime) is found and
// recorded when the manager's own release is refused as already released:
// Destroy answers with the node's verified clean proof and the database
// says released.
func TestDestroyAfterNodeReleasedItself(t *testing.T) {
	ctx := context.Background()
	m, n := setup(t)
	res, err := m.Create(ctx, "sb1", testSpec())
	if err != nil {
		t.Fatal(err)
	}
	nodeOp := "exit-" + res.Sandbox.ContainerID
	if _, err := n.SelfRelease("sb1", nodeOp); err != nil {
		t.Fatal(err)
	}
	d, err := m.Destroy(ctx, "sb1")
	if err != nil {
		t.Fatalf("destroy after the node's own release: %v", err)
	}
	if !d.Verdict.OK() || d.OperationID != nodeOp || !d.AlreadyReleased || d.Sandbox.State != api.StateReleased {
		t.Fatalf("destroy = %+v, want the node's clean proof under %s", d, nodeOp)
	}
	rec, err := m.Store.Sandbox(ctx, "sb1")
	if err != nil || rec.State != api.StateReleased {
		t.Fatalf("recorded = %+v, %v; want released", rec, err)
	}
	pr, err := m.Store.Proof(ctx, nodeOp)
	if err != nil || !pr.Verified || pr.VerifyError != "" || pr.Proof.OperationID != nodeOp {
		t.Fatalf("stored proof = %+v, %v", pr, err)
	}
	ops, err := m.Store.Operations(ctx, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	var mine, node int
	for _, op := range ops {
		switch {
		case op.Kind == KindRelease && op.OperationID == nodeOp && op.State == OpDone:
			node++
		case op.Kind == KindRelease && op.State == OpFailed && strings.Contains(op.Error, nodeOp):
			mine++
		}
	}
	if mine != 1 || node != 1 {
		t.Fatalf("operations = %+v; want the manager's release failed naming %s and that one done", ops, nodeOp)
	}
	// A second destroy answers from the record, the same proof.
	again, err := m.Destroy(ctx, "sb1")
	if err != nil || !again.AlreadyReleased || again.OperationID != nodeOp || !again.Verdict.OK() {
		t.Fatalf("second destroy = %+v, %v", again, err)
	}
}

// The node's own release is judged like any proof: one signed by another
// key is recorded rejected, so the capacity is not given back.
func TestDestroyAfterNodeReleasedItselfForgedProof(t *testing.T) {
	ctx := context.Background()
	m, n := setup(t)
	// Pin the node's key with a first release.
	if _, err := m.Create(ctx, "sb0", testSpec()); err != nil {
		t.Fatal(err)
	}
	if d, err := m.Destroy(ctx, "sb0"); err != nil || !d.Verdict.OK() {
		t.Fatalf("first destroy = %+v, %v", d, err)
	}
	res, err := m.Create(ctx, "sb1", testSpec())
	if err != nil {
		t.Fatal(err)
	}
	_, impostor, _ := ed25519.GenerateKey(nil)
	n.Lock()
	n.Signer = impostor
	n.Unlock()
	if _, err := n.SelfRelease("sb1", "expire-"+res.Sandbox.ContainerID); err != nil {
		t.Fatal(err)
	}
	d, err := m.Destroy(ctx, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	if d.Verdict.Verified || d.Verdict.OK() || !strings.Contains(d.Verdict.Reason, "pinned key") {
		t.Fatalf("verdict = %+v, want rejected", d.Verdict)
	}
}

// A conflict that is not the node's own release (the sandbox is still
// there) stays a definitive refusal.
func TestDestroyConflictNotAReleaseStaysRefused(t *testing.T) {
	ctx := context.Background()
	m, n := setup(t)
	if _, err := m.Create(ctx, "sb1", testSpec()); err != nil {
		t.Fatal(err)
	}
	n.Lock()
	n.FailRelease = func(api.ReleaseRequest) error { return errConflictForTest }
	n.Unlock()
	if _, err := m.Destroy(ctx, "sb1"); err == nil {
		t.Fatal("destroy succeeded on a refused release of a ready sandbox")
	}
	rec, err := m.Store.Sandbox(ctx, "sb1")
	if err != nil || rec.State == api.StateReleased {
		t.Fatalf("recorded = %+v, %v; want not released", rec, err)
	}
}

var errConflictForTest = errdefs.Errorf(errdefs.CodeConflict, "sandbox is busy")

// A pause of a generation the node released itself records that release
// and answers conflict: no head was sealed.
func TestPauseAfterNodeReleasedItself(t *testing.T) {
	ctx := context.Background()
	m, n := setup(t)
	spec := testSpec()
	spec.RootFS = api.RootFS{Mode: api.RootFSBlock, Template: "busybox"}
	res, err := m.Create(ctx, "sb1", spec)
	if err != nil {
		t.Fatal(err)
	}
	nodeOp := "expire-" + res.Sandbox.ContainerID
	if _, err := n.SelfRelease("sb1", nodeOp); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Pause(ctx, "sb1"); errdefs.CodeOf(err) != errdefs.CodeConflict || !strings.Contains(err.Error(), nodeOp) {
		t.Fatalf("pause after the node's own release: %v, want conflict naming %s", err, nodeOp)
	}
	if rec, err := m.Store.Sandbox(ctx, "sb1"); err != nil || rec.State != api.StateReleased {
		t.Fatalf("recorded = %+v, %v; want released", rec, err)
	}
	if h, err := m.Store.Head(ctx, "sb1"); err != nil || h.Seq != 0 {
		t.Fatalf("head = %+v, %v; want none", h, err)
	}
}
