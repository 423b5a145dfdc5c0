package proof

import (
	"crypto/ed25519"
	"errors"
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
