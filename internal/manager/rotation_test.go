package manager

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/manager/fakenode"
	"github.com/ctld/ctld/internal/proof"
)

func wireRotation(r proof.Rotation) *api.KeyRotation {
	return &api.KeyRotation{Version: r.Version, NodeID: r.NodeID, OldKey: r.OldKey, NewKey: r.NewKey, IssuedAt: r.IssuedAt, OldSignature: r.OldSignature, NewSignature: r.NewSignature}
}

// present makes the fake node present key k (and sign its proofs with
// it) with rotation r.
func present(n *fakenode.Node, k ed25519.PrivateKey, r *api.KeyRotation) {
	n.Lock()
	defer n.Unlock()
	n.Key, n.Signer, n.Rotation = k, k, r
}

// TestNodeKeyRotation (issue 21): over the API socket, a node that
// presents a new key is refused (conflict, the pin unchanged) unless it
// carries a rotation its pinned key signed: an unsigned or forged one is
// refused the same; a properly signed one moves the pin, and proofs the
// old key signed still verify during the overlap, while a stranger's do
// not.
func TestNodeKeyRotation(t *testing.T) {
	ctx := context.Background()
	m, n := setup(t)
	k1 := n.Key
	if _, err := m.Create(ctx, "sb1", testSpec()); err != nil {
		t.Fatal(err)
	}
	pinned := func() NodeRecord {
		t.Helper()
		rec, err := m.Store.Node(ctx, n.NodeID)
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	if !bytes.Equal(pinned().PublicKey, k1.Public().(ed25519.PublicKey)) {
		t.Fatal("first contact did not pin the node's key")
	}
	_, k2, _ := ed25519.GenerateKey(nil)
	_, k3, _ := ed25519.GenerateKey(nil)
	at := time.Date(2026, 12, 6, 15, 0, 0, 0, time.UTC)
	forged := proof.SignRotation(n.NodeID, k3, k2, at)
	forged.OldKey = k1.Public().(ed25519.PublicKey) // claims to come from the pinned key
	unsigned := proof.SignRotation(n.NodeID, k1, k2, at)
	unsigned.OldSignature = nil
	for name, r := range map[string]*api.KeyRotation{"no rotation": nil, "unsigned": wireRotation(unsigned), "forged": wireRotation(forged)} {
		present(n, k2, r)
		_, err := m.Create(ctx, "sb-"+strings.ReplaceAll(name, " ", "-"), testSpec())
		if errdefs.CodeOf(err) != errdefs.CodeConflict || !strings.Contains(err.Error(), "not its pinned key") {
			t.Fatalf("%s: %v, want conflict", name, err)
		}
		if !bytes.Equal(pinned().PublicKey, k1.Public().(ed25519.PublicKey)) {
			t.Fatalf("%s moved the pinned key", name)
		}
	}

	present(n, k2, wireRotation(proof.SignRotation(n.NodeID, k1, k2, at)))
	if _, err := m.Create(ctx, "sb2", testSpec()); err != nil {
		t.Fatalf("claim after a signed rotation: %v", err)
	}
	rec := pinned()
	if !bytes.Equal(rec.PublicKey, k2.Public().(ed25519.PublicKey)) || !bytes.Equal(rec.PreviousKey, k1.Public().(ed25519.PublicKey)) {
		t.Fatalf("after the rotation: pinned %x, previous %x", rec.PublicKey, rec.PreviousKey)
	}
	// A proof signed with the old key (made before the rotation) during
	// the overlap, then a stranger's.
	present(n, k2, nil)
	n.Lock()
	n.Signer = k1
	n.Unlock()
	d, err := m.Destroy(ctx, "sb1")
	if err != nil || !d.Verdict.Verified {
		t.Fatalf("proof of the old key in the overlap: %+v, %v", d.Verdict, err)
	}
	n.Lock()
	n.Signer = k3
	n.Unlock()
	if d, err := m.Destroy(ctx, "sb2"); err != nil || d.Verdict.Verified {
		t.Fatalf("proof of a stranger's key: %+v, %v; want not verified", d.Verdict, err)
	}
	// After the overlap only the new key is trusted.
	if keys := rec.TrustedKeys(rec.PreviousUntil); len(keys) != 1 || !bytes.Equal(keys[0], k2.Public().(ed25519.PublicKey)) {
		t.Fatalf("trusted keys after the overlap: %x", keys)
	}
}
