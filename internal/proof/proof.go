package proof

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Version is the version of the signed payload Sign writes. Verify also
// accepts version 0: the proofs written before the payload had a version
// (the same members without "version").
const Version = 1

// Verification failures, so a verifier can tell a forged proof from a
// proof that honestly says "not clean".
var (
	ErrUntrustedKey = errors.New("proof signed by an untrusted key")
	ErrBadSignature = errors.New("proof signature invalid")
	ErrInconsistent = errors.New("proof clean flag disagrees with its checks")
	ErrVersion      = errors.New("proof payload version unknown")
)

// Check is one check of a cleanup proof.
type Check struct {
	Name   string `json:"name"` // e.g. "cgroup_removed"
	OK     bool   `json:"ok"`
	Detail string `json:"detail,omitempty"`
}

// Proof is a cleanup proof: the signed statement that everything of one
// generation is physically gone (Clean) or which checks failed. It is the
// record the journal stores; the API sends it as api.CleanupProof, a
// conversion that carries every field, so a verifier on the other side
// rebuilds the same signed payload. The JSON tags are the journal's
// encoding (and match the API's, so older journals decode); the signature
// does not cover this JSON but the payload of SignedBytes.
type Proof struct {
	// Version is the version of the signed payload (Version when Sign
	// made it; 0 for a proof made before versions).
	Version     int       `json:"version,omitempty"`
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
	// NodeKey is the ed25519 public key of the signer.
	NodeKey   []byte `json:"node_key"`
	Signature []byte `json:"signature"`
}

// payloadV1 is what a version 1 signature covers. Its JSON encoding is the
// signed payload: members in this order, compact, Go's encoding/json
// escaping, the time in RFC 3339 with nanoseconds and the proof's zone, the
// key in standard base64, and "signature":null last (the signature's own
// place, empty). These types are frozen: a change here is a new version,
// never an edit (TestSignedBytesGolden pins the bytes).
type payloadV1 struct {
	Version     int         `json:"version"`
	OperationID string      `json:"operation_id"`
	NodeID      string      `json:"node_id"`
	BootID      string      `json:"boot_id"`
	Epoch       uint64      `json:"epoch"`
	SandboxID   string      `json:"sandbox_id"`
	Generation  uint64      `json:"generation"`
	LeaseID     string      `json:"lease_id"`
	Checks      []payloadCh `json:"checks"`
	Clean       bool        `json:"clean"`
	Time        time.Time   `json:"time"`
	NodeKey     []byte      `json:"node_key"`
	Signature   []byte      `json:"signature"`
}

// payloadV0 is the payload of the proofs signed before versions: version
// 1's members without "version" (the API's JSON of the time).
type payloadV0 struct {
	OperationID string      `json:"operation_id"`
	NodeID      string      `json:"node_id"`
	BootID      string      `json:"boot_id"`
	Epoch       uint64      `json:"epoch"`
	SandboxID   string      `json:"sandbox_id"`
	Generation  uint64      `json:"generation"`
	LeaseID     string      `json:"lease_id"`
	Checks      []payloadCh `json:"checks"`
	Clean       bool        `json:"clean"`
	Time        time.Time   `json:"time"`
	NodeKey     []byte      `json:"node_key"`
	Signature   []byte      `json:"signature"`
}

type payloadCh struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail,omitempty"`
}

// SignedBytes is what the signature of p covers: the payload of p.Version
// (see payloadV1) with an empty signature.
func SignedBytes(p Proof) ([]byte, error) {
	var checks []payloadCh
	if p.Checks != nil {
		checks = make([]payloadCh, len(p.Checks))
		for i, c := range p.Checks {
			checks[i] = payloadCh(c)
		}
	}
	var v any
	switch p.Version {
	case 1:
		v = payloadV1{
			Version: 1, OperationID: p.OperationID, NodeID: p.NodeID, BootID: p.BootID, Epoch: p.Epoch,
			SandboxID: p.SandboxID, Generation: p.Generation, LeaseID: p.LeaseID, Checks: checks,
			Clean: p.Clean, Time: p.Time, NodeKey: p.NodeKey,
		}
	case 0:
		v = payloadV0{
			OperationID: p.OperationID, NodeID: p.NodeID, BootID: p.BootID, Epoch: p.Epoch,
			SandboxID: p.SandboxID, Generation: p.Generation, LeaseID: p.LeaseID, Checks: checks,
			Clean: p.Clean, Time: p.Time, NodeKey: p.NodeKey,
		}
	default:
		return nil, fmt.Errorf("encode proof: %w: %d", ErrVersion, p.Version)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode proof: %w", err)
	}
	return b, nil
}

// allOK is the only value Clean may have: a proof with no checks proves
// nothing, so it cannot be clean.
func allOK(checks []Check) bool {
	if len(checks) == 0 {
		return false
	}
	for _, c := range checks {
		if !c.OK {
			return false
		}
	}
	return true
}

// Sign sets p.Version, p.NodeKey and p.Signature. The caller fills in
// everything else, with NodeID and BootID from id; Sign refuses a proof
// that names another node or boot, or whose Clean flag disagrees with its
// checks.
func Sign(id Identity, p *Proof) error {
	if p.NodeID != id.NodeID || p.BootID != id.BootID {
		return fmt.Errorf("sign proof: proof is for node %q boot %q, identity is node %q boot %q", p.NodeID, p.BootID, id.NodeID, id.BootID)
	}
	if p.Clean != allOK(p.Checks) {
		return fmt.Errorf("sign proof: %w (clean=%v)", ErrInconsistent, p.Clean)
	}
	q := *p
	q.Version = Version
	q.NodeKey = append([]byte(nil), id.PublicKey()...)
	msg, err := SignedBytes(q)
	if err != nil {
		return fmt.Errorf("sign proof: %w", err)
	}
	q.Signature = ed25519.Sign(id.Key, msg)
	*p = q
	return nil
}

// Verify checks that p was signed by trusted (or, with trusted nil, by the
// key it carries, which proves integrity but not origin) and that its Clean
// flag matches its checks. A valid proof with Clean false is not an error.
func Verify(p Proof, trusted ed25519.PublicKey) error {
	if len(p.NodeKey) != ed25519.PublicKeySize {
		return fmt.Errorf("verify proof: %w: node key is %d bytes", ErrUntrustedKey, len(p.NodeKey))
	}
	if trusted != nil && !bytes.Equal(p.NodeKey, trusted) {
		return fmt.Errorf("verify proof: %w", ErrUntrustedKey)
	}
	msg, err := SignedBytes(p)
	if err != nil {
		return fmt.Errorf("verify proof: %w", err)
	}
	if !ed25519.Verify(ed25519.PublicKey(p.NodeKey), msg, p.Signature) {
		return fmt.Errorf("verify proof: %w", ErrBadSignature)
	}
	if p.Clean != allOK(p.Checks) {
		return fmt.Errorf("verify proof: %w", ErrInconsistent)
	}
	return nil
}
