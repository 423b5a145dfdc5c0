package proof

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
)

func testIdentity(t *testing.T) Identity {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return Identity{NodeID: "0123456789abcdef0123456789abcdef", BootID: "boot-1", Key: key}
}

func cleanProof(id Identity) api.CleanupProof {
	return api.CleanupProof{
		OperationID: "op-1",
		NodeID:      id.NodeID,
		BootID:      id.BootID,
		Epoch:       7,
		SandboxID:   "sbx-1",
		Generation:  3,
		LeaseID:     "lease-1",
		Checks: []api.ProofCheck{
			{Name: "cgroup_removed", OK: true},
			{Name: "runsc_container_absent", OK: true},
			{Name: "nbd_disconnected", OK: true, Detail: "nbd3 size 0"},
		},
		Clean: true,
		Time:  time.Date(2026, 11, 29, 12, 0, 0, 123456789, time.FixedZone("CET", 3600)),
	}
}

func TestSignVerifyRoundTripThroughJSON(t *testing.T) {
	id := testIdentity(t)
	p := cleanProof(id)
	if err := Sign(id, &p); err != nil {
		t.Fatalf("Sign: %v", err)
	}
	// The manager verifies what came over the wire, not our struct.
	wire, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var got api.CleanupProof
	if err := json.Unmarshal(wire, &got); err != nil {
		t.Fatal(err)
	}
	if err := Verify(got, id.PublicKey()); err != nil {
		t.Fatalf("Verify with trusted key: %v", err)
	}
	if err := Verify(got, nil); err != nil {
		t.Fatalf("Verify with carried key: %v", err)
	}
}

func TestUncleanProofVerifies(t *testing.T) {
	id := testIdentity(t)
	p := cleanProof(id)
	p.Checks[1].OK = false
	p.Clean = false
	if err := Sign(id, &p); err != nil {
		t.Fatalf("Sign: %v", err)
	}
	if err := Verify(p, id.PublicKey()); err != nil {
		t.Fatalf("an honest unclean proof must verify: %v", err)
	}
}

func TestVerifyRejectsTampering(t *testing.T) {
	id := testIdentity(t)
	signed := cleanProof(id)
	if err := Sign(id, &signed); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		tamper func(p *api.CleanupProof)
		want   error
	}{
		{"epoch", func(p *api.CleanupProof) { p.Epoch++ }, ErrBadSignature},
		{"generation", func(p *api.CleanupProof) { p.Generation-- }, ErrBadSignature},
		{"sandbox", func(p *api.CleanupProof) { p.SandboxID = "sbx-2" }, ErrBadSignature},
		{"lease", func(p *api.CleanupProof) { p.LeaseID = "lease-2" }, ErrBadSignature},
		{"boot", func(p *api.CleanupProof) { p.BootID = "boot-2" }, ErrBadSignature},
		{"time", func(p *api.CleanupProof) { p.Time = p.Time.Add(time.Nanosecond) }, ErrBadSignature},
		{"check detail", func(p *api.CleanupProof) { p.Checks[2].Detail = "nbd4 size 0" }, ErrBadSignature},
		{"dropped check", func(p *api.CleanupProof) { p.Checks = p.Checks[:2] }, ErrBadSignature},
		{"check flipped", func(p *api.CleanupProof) { p.Checks[0].OK = false }, ErrBadSignature},
		{"clean flipped", func(p *api.CleanupProof) { p.Clean = false }, ErrBadSignature},
		{"signature", func(p *api.CleanupProof) { p.Signature[0] ^= 1 }, ErrBadSignature},
		{"no signature", func(p *api.CleanupProof) { p.Signature = nil }, ErrBadSignature},
		{"key swapped", func(p *api.CleanupProof) { p.NodeKey = testIdentity(t).PublicKey() }, ErrUntrustedKey},
		{"key truncated", func(p *api.CleanupProof) { p.NodeKey = p.NodeKey[:5] }, ErrUntrustedKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := signed
			p.Checks = append([]api.ProofCheck(nil), signed.Checks...)
			p.Signature = append([]byte(nil), signed.Signature...)
			p.NodeKey = append([]byte(nil), signed.NodeKey...)
			tc.tamper(&p)
			if err := Verify(p, id.PublicKey()); !errors.Is(err, tc.want) {
				t.Fatalf("Verify = %v, want %v", err, tc.want)
			}
		})
	}
	if err := Verify(signed, id.PublicKey()); err != nil {
		t.Fatalf("untampered proof no longer verifies (test aliasing?): %v", err)
	}
}

func TestVerifyRejectsWrongTrustedKey(t *testing.T) {
	id := testIdentity(t)
	p := cleanProof(id)
	if err := Sign(id, &p); err != nil {
		t.Fatal(err)
	}
	if err := Verify(p, testIdentity(t).PublicKey()); !errors.Is(err, ErrUntrustedKey) {
		t.Fatalf("Verify with another node's key = %v, want ErrUntrustedKey", err)
	}
}

func TestVerifyRejectsSelfSignedForgery(t *testing.T) {
	// A forger re-signing with its own key passes only a verifier that
	// trusts the carried key; one that pins the node key rejects it.
	id := testIdentity(t)
	forger := testIdentity(t)
	p := cleanProof(forger)
	if err := Sign(forger, &p); err != nil {
		t.Fatal(err)
	}
	if err := Verify(p, id.PublicKey()); !errors.Is(err, ErrUntrustedKey) {
		t.Fatalf("Verify = %v, want ErrUntrustedKey", err)
	}
}

func TestVerifyRejectsInconsistentClean(t *testing.T) {
	id := testIdentity(t)
	// Signed by the real key, but claims clean with a failed check: built by
	// hand because Sign refuses it.
	p := cleanProof(id)
	p.Checks[0].OK = false
	p.NodeKey = id.PublicKey()
	msg, err := SignedBytes(p)
	if err != nil {
		t.Fatal(err)
	}
	p.Signature = ed25519.Sign(id.Key, msg)
	if err := Verify(p, id.PublicKey()); !errors.Is(err, ErrInconsistent) {
		t.Fatalf("Verify = %v, want ErrInconsistent", err)
	}
}

func TestSignRefusesBadProofs(t *testing.T) {
	id := testIdentity(t)
	for _, tc := range []struct {
		name   string
		mutate func(p *api.CleanupProof)
	}{
		{"clean with failed check", func(p *api.CleanupProof) { p.Checks[0].OK = false }},
		{"clean without checks", func(p *api.CleanupProof) { p.Checks = nil }},
		{"unclean with all checks ok", func(p *api.CleanupProof) { p.Clean = false }},
		{"other node", func(p *api.CleanupProof) { p.NodeID = "ffffffffffffffffffffffffffffffff" }},
		{"other boot", func(p *api.CleanupProof) { p.BootID = "boot-0" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := cleanProof(id)
			tc.mutate(&p)
			if err := Sign(id, &p); err == nil {
				t.Fatal("Sign accepted the proof")
			}
			if p.Signature != nil {
				t.Fatal("Sign set a signature on a refused proof")
			}
		})
	}
}

func TestSignedBytesIgnoresSignature(t *testing.T) {
	id := testIdentity(t)
	p := cleanProof(id)
	a, err := SignedBytes(p)
	if err != nil {
		t.Fatal(err)
	}
	p.Signature = []byte("anything")
	b, err := SignedBytes(p)
	if err != nil {
		t.Fatal(err)
	}
	if string(a) != string(b) {
		t.Fatalf("signed bytes depend on the signature:\n%s\n%s", a, b)
	}
	if p.Signature == nil {
		t.Fatal("SignedBytes cleared the caller's signature")
	}
}
