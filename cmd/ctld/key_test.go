package main

import (
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/proof"
)

// TestKeyRotate: `ctld key rotate` moves the state dir's proof key and
// leaves the record the old key signed, which the next start loads.
func TestKeyRotate(t *testing.T) {
	dir := t.TempDir()
	before, err := proof.LoadOrCreateIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	r := ctld(t, "--state-dir", dir, "key", "rotate")
	if r.code != 0 || !strings.Contains(r.stdout, "replaces") {
		t.Fatalf("key rotate: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	after, err := proof.LoadOrCreateIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	if after.PublicKey().Equal(before.PublicKey()) || after.Rotation == nil {
		t.Fatalf("after key rotate: same key %v, rotation %+v", after.PublicKey().Equal(before.PublicKey()), after.Rotation)
	}
	if err := proof.VerifyRotation(*after.Rotation, before.NodeID, before.PublicKey()); err != nil {
		t.Fatalf("the rotation does not follow from the old key: %v", err)
	}
}
