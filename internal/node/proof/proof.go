package proof

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/ctld/ctld/internal/api"
)

// Verification failures, so a verifier can tell a forged proof from a
// proof that honestly says "not clean".
var (
	ErrUntrustedKey = errors.New("proof signed by an untrusted key")
	ErrBadSignature = errors.New("proof signature invalid")
	ErrInconsistent = errors.New("proof clean flag disagrees with its checks")
)

// SignedBytes is what the signature covers: the proof's JSON with an empty
// signature. encoding/json emits struct fields in declaration order, so the
// verifier re-encoding the decoded proof gets the same bytes.
func SignedBytes(p api.CleanupProof) ([]byte, error) {
	p.Signature = nil
	b, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("encode proof: %w", err)
	}
	return b, nil
}

// allOK is the only value Clean may have: a proof with no checks proves
// nothing, so it cannot be clean.
func allOK(checks []api.ProofCheck) bool {
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

// Sign sets p.NodeKey and p.Signature. The caller fills in everything else,
// with NodeID and BootID from id; Sign refuses a proof that names another
// node or boot, or whose Clean flag disagrees with its checks.
func Sign(id Identity, p *api.CleanupProof) error {
	if p.NodeID != id.NodeID || p.BootID != id.BootID {
		return fmt.Errorf("sign proof: proof is for node %q boot %q, identity is node %q boot %q", p.NodeID, p.BootID, id.NodeID, id.BootID)
	}
	if p.Clean != allOK(p.Checks) {
		return fmt.Errorf("sign proof: %w (clean=%v)", ErrInconsistent, p.Clean)
	}
	p.NodeKey = append([]byte(nil), id.PublicKey()...)
	msg, err := SignedBytes(*p)
	if err != nil {
		return fmt.Errorf("sign proof: %w", err)
	}
	p.Signature = ed25519.Sign(id.Key, msg)
	return nil
}

// Verify checks that p was signed by trusted (or, with trusted nil, by the
// key it carries, which proves integrity but not origin) and that its Clean
// flag matches its checks. A valid proof with Clean false is not an error.
func Verify(p api.CleanupProof, trusted ed25519.PublicKey) error {
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
