package proof

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func newKey(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	_, k, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestVerifyRotation: a rotation signed by the pinned key and the new key
// moves the pin; an unsigned, forged, replayed-elsewhere or altered one
// is ErrRotation.
func TestVerifyRotation(t *testing.T) {
	old, next, other := newKey(t), newKey(t), newKey(t)
	pinned := old.Public().(ed25519.PublicKey)
	at := time.Date(2026, 12, 6, 15, 0, 0, 0, time.UTC)
	good := SignRotation("n1", old, next, at)
	if err := VerifyRotation(good, "n1", pinned); err != nil {
		t.Fatalf("a rotation signed by the pinned key: %v", err)
	}
	cases := map[string]func(r *Rotation){
		"unsigned":                  func(r *Rotation) { r.OldSignature, r.NewSignature = nil, nil },
		"not signed by the new key": func(r *Rotation) { r.NewSignature = nil },
		"signed by another key as the old": func(r *Rotation) {
			r.OldSignature = ed25519.Sign(other, RotationBytes(*r))
		},
		"to a key the node does not hold": func(r *Rotation) {
			r.NewKey = other.Public().(ed25519.PublicKey)
			r.OldSignature = ed25519.Sign(old, RotationBytes(*r))
		},
		"from a key that is not pinned": func(r *Rotation) { *r = SignRotation("n1", other, next, at) },
		"for another node":              func(r *Rotation) { *r = SignRotation("n2", old, next, at) },
		"altered time":                  func(r *Rotation) { r.IssuedAt = r.IssuedAt.Add(time.Hour) },
		"another version":               func(r *Rotation) { r.Version = 2 },
		"to the same key":               func(r *Rotation) { *r = SignRotation("n1", old, old, at) },
	}
	for name, mod := range cases {
		r := good
		mod(&r)
		if err := VerifyRotation(r, "n1", pinned); !errors.Is(err, ErrRotation) {
			t.Errorf("%s: %v, want ErrRotation", name, err)
		}
	}
}

// TestRotateIdentity: a rotation puts a new key in place (0600, the old
// one kept), and the identity loaded next carries the record the old
// key signed, which a manager that pinned the old key accepts; a
// rotation that stopped before its key was in place is ignored.
func TestRotateIdentity(t *testing.T) {
	dir := t.TempDir()
	boot := fakeBootID(t, "boot-1")
	before, err := loadOrCreateIdentity(dir, boot)
	if err != nil {
		t.Fatal(err)
	}
	if before.Rotation != nil {
		t.Fatal("a fresh identity carries a rotation")
	}
	_, err = rotateIdentity(dir, boot, time.Date(2026, 12, 6, 15, 0, 0, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	after, err := loadOrCreateIdentity(dir, boot)
	if err != nil {
		t.Fatal(err)
	}
	if after.NodeID != before.NodeID || after.PublicKey().Equal(before.PublicKey()) || after.Rotation == nil || !after.Rotation.NewKey.Equal(after.PublicKey()) {
		t.Fatalf("after the rotation: node %s key %x rotation %+v", after.NodeID, after.PublicKey(), after.Rotation)
	}
	if err := VerifyRotation(*after.Rotation, before.NodeID, before.PublicKey()); err != nil {
		t.Fatalf("the record does not move the old pin: %v", err)
	}
	for _, name := range []string{keyName, prevKeyName} {
		fi, err := os.Stat(filepath.Join(dir, identityDir, name))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v, mode %v; want 0600", name, err, fi.Mode())
		}
	}
	// A second rotation whose key never got in place (crash): the record
	// names another key and the identity carries none.
	_, next, _ := ed25519.GenerateKey(nil)
	stale := SignRotation(after.NodeID, after.Key, next, time.Now())
	b, _ := json.Marshal(stale)
	if err := os.WriteFile(filepath.Join(dir, identityDir, rotationName), b, 0o644); err != nil {
		t.Fatal(err)
	}
	again, err := loadOrCreateIdentity(dir, boot)
	if err != nil || again.Rotation != nil || !again.PublicKey().Equal(after.PublicKey()) {
		t.Fatalf("after an unfinished rotation: %v, rotation %+v", err, again.Rotation)
	}
}
