package proof

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"testing"
	"time"
)

func testIdentity(t *testing.T) Identity {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return Identity{NodeID: "0123456789abcdef0123456789abcdef", BootID: "boot-1", Key: key}
}

func cleanProof(id Identity) Proof {
	return Proof{
		OperationID: "op-1",
		NodeID:      id.NodeID,
		BootID:      id.BootID,
		Epoch:       7,
		SandboxID:   "sbx-1",
		Generation:  3,
		LeaseID:     "lease-1",
		Checks: []Check{
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
	if p.Version != Version {
		t.Fatalf("Sign wrote version %d, want %d", p.Version, Version)
	}
	// A verifier checks what it decoded, not our struct.
	wire, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var got Proof
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
		tamper func(p *Proof)
		want   error
	}{
		{"epoch", func(p *Proof) { p.Epoch++ }, ErrBadSignature},
		{"generation", func(p *Proof) { p.Generation-- }, ErrBadSignature},
		{"sandbox", func(p *Proof) { p.SandboxID = "sbx-2" }, ErrBadSignature},
		{"lease", func(p *Proof) { p.LeaseID = "lease-2" }, ErrBadSignature},
		{"boot", func(p *Proof) { p.BootID = "boot-2" }, ErrBadSignature},
		{"time", func(p *Proof) { p.Time = p.Time.Add(time.Nanosecond) }, ErrBadSignature},
		{"check detail", func(p *Proof) { p.Checks[2].Detail = "nbd4 size 0" }, ErrBadSignature},
		{"dropped check", func(p *Proof) { p.Checks = p.Checks[:2] }, ErrBadSignature},
		{"check flipped", func(p *Proof) { p.Checks[0].OK = false }, ErrBadSignature},
		{"clean flipped", func(p *Proof) { p.Clean = false }, ErrBadSignature},
		{"signature", func(p *Proof) { p.Signature[0] ^= 1 }, ErrBadSignature},
		{"no signature", func(p *Proof) { p.Signature = nil }, ErrBadSignature},
		{"key swapped", func(p *Proof) { p.NodeKey = testIdentity(t).PublicKey() }, ErrUntrustedKey},
		{"version", func(p *Proof) { p.Version = 0 }, ErrBadSignature},
		{"unknown version", func(p *Proof) { p.Version = 2 }, ErrVersion},
		{"key truncated", func(p *Proof) { p.NodeKey = p.NodeKey[:5] }, ErrUntrustedKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := signed
			p.Checks = append([]Check(nil), signed.Checks...)
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
		mutate func(p *Proof)
	}{
		{"clean with failed check", func(p *Proof) { p.Checks[0].OK = false }},
		{"clean without checks", func(p *Proof) { p.Checks = nil }},
		{"unclean with all checks ok", func(p *Proof) { p.Clean = false }},
		{"other node", func(p *Proof) { p.NodeID = "ffffffffffffffffffffffffffffffff" }},
		{"other boot", func(p *Proof) { p.BootID = "boot-0" }},
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

// goldenIdentity signs with a fixed key: ed25519 signatures are
// deterministic, so the signature is pinned too.
func goldenIdentity() Identity {
	seed := make([]byte, ed25519.SeedSize)
	for i := range seed {
		seed[i] = byte(i)
	}
	return Identity{NodeID: "0123456789abcdef0123456789abcdef", BootID: "boot-1", Key: ed25519.NewKeyFromSeed(seed)}
}

// The signed payload is a contract with every verifier (managers, stored
// proofs): these bytes must never change for version 1. If this test
// fails, the change broke every signature already made; make a new
// version instead.
func TestSignedBytesGolden(t *testing.T) {
	id := goldenIdentity()
	p := cleanProof(id)
	p.Checks[1].Detail = "quote \" <&> é"
	if err := Sign(id, &p); err != nil {
		t.Fatal(err)
	}
	got, err := SignedBytes(p)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"version":1,"operation_id":"op-1","node_id":"0123456789abcdef0123456789abcdef","boot_id":"boot-1",` +
		`"epoch":7,"sandbox_id":"sbx-1","generation":3,"lease_id":"lease-1","checks":[{"name":"cgroup_removed","ok":true},` +
		`{"name":"runsc_container_absent","ok":true,"detail":"quote \" \u003c\u0026\u003e é"},{"name":"nbd_disconnected","ok":true,"detail":"nbd3 size 0"}],` +
		`"clean":true,"time":"2026-11-29T12:00:00.123456789+01:00","node_key":"A6EHv/POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg=","signature":null}`
	if string(got) != want {
		t.Fatalf("signed bytes changed:\n got %s\nwant %s", got, want)
	}
	const wantSig = "200bb6089c75030bddd9acf968da80b4dac24534b544d2815ea02f3a13a053350688461e399dd2c35c6f15e3ef7e844f40d196ffb07f347aec235568234d8807"
	if s := hex.EncodeToString(p.Signature); s != wantSig {
		t.Fatalf("signature = %s, want %s", s, wantSig)
	}
	// The documented bytes alone are enough for a verifier.
	if !ed25519.Verify(id.PublicKey(), []byte(want), p.Signature) {
		t.Fatal("the signature does not verify over the documented bytes")
	}
}

// legacyProof is the API's CleanupProof as it was when proofs had no
// version: its JSON with a nil signature was the signed payload.
type legacyProof struct {
	OperationID string    `json:"operation_id"`
	NodeID      string    `json:"node_id"`
	BootID      string    `json:"boot_id"`
	Epoch       uint64    `json:"epoch"`
	SandboxID   string    `json:"sandbox_id"`
	Generation  uint64    `json:"generation"`
	LeaseID     string    `json:"lease_id"`
	Checks      []Check   `json:"checks"`
	Clean       bool      `json:"clean"`
	Time        time.Time `json:"time"`
	NodeKey     []byte    `json:"node_key"`
	Signature   []byte    `json:"signature"`
}

// A proof signed before versions (stored in a journal or a manager's
// database) still verifies after it is decoded into Proof.
func TestVersion0ProofsStillVerify(t *testing.T) {
	id := testIdentity(t)
	p := cleanProof(id)
	old := legacyProof{
		OperationID: p.OperationID, NodeID: p.NodeID, BootID: p.BootID, Epoch: p.Epoch, SandboxID: p.SandboxID,
		Generation: p.Generation, LeaseID: p.LeaseID, Checks: p.Checks, Clean: p.Clean, Time: p.Time,
		NodeKey: id.PublicKey(),
	}
	msg, err := json.Marshal(old)
	if err != nil {
		t.Fatal(err)
	}
	old.Signature = ed25519.Sign(id.Key, msg)
	stored, err := json.Marshal(old)
	if err != nil {
		t.Fatal(err)
	}
	var got Proof
	if err := json.Unmarshal(stored, &got); err != nil {
		t.Fatal(err)
	}
	if got.Version != 0 {
		t.Fatalf("legacy proof decoded as version %d", got.Version)
	}
	if err := Verify(got, id.PublicKey()); err != nil {
		t.Fatalf("legacy proof: %v", err)
	}
	// Claiming version 1 for it changes what the signature must cover.
	got.Version = 1
	if err := Verify(got, id.PublicKey()); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("legacy proof as version 1: %v, want ErrBadSignature", err)
	}
}
