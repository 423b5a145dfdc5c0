package proof

import (
	"bytes"
	"crypto/ed25519"
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// Key rotation (issue 21). A manager pins a node's proof key on first
// contact; the node moves to a new key with a Rotation the old key signs
// (the pinned key names its successor) and the new key signs too (the
// node holds it). A manager that has the old key pinned verifies the
// record, pins the new key and keeps the old one valid for an overlap,
// for proofs signed before the rotation that it has not judged yet. A
// record the pinned key did not sign is refused, and the pinned key
// stays.

// RotationVersion is the version of the signed rotation payload.
const RotationVersion = 1

// ErrRotation: a rotation record that does not move the pinned key.
var ErrRotation = errors.New("key rotation refused")

// Rotation moves node NodeID's proof key from OldKey to NewKey.
type Rotation struct {
	Version  int               `json:"version"`
	NodeID   string            `json:"node_id"`
	OldKey   ed25519.PublicKey `json:"old_key"`
	NewKey   ed25519.PublicKey `json:"new_key"`
	IssuedAt time.Time         `json:"issued_at"`
	// OldSignature and NewSignature sign RotationBytes with the old and
	// the new key.
	OldSignature []byte `json:"old_signature"`
	NewSignature []byte `json:"new_signature"`
}

const rotationDomain = "ctld key rotation\x00"

// RotationBytes is the payload both keys sign: a domain tag, the version,
// the node id, both keys and the time (ns since the epoch), length-
// prefixed and big-endian, so no other signed message of the node's key
// (a proof's JSON) can be taken for it.
func RotationBytes(r Rotation) []byte {
	var b bytes.Buffer
	b.WriteString(rotationDomain)
	binary.Write(&b, binary.BigEndian, uint32(r.Version))
	for _, f := range [][]byte{[]byte(r.NodeID), r.OldKey, r.NewKey} {
		binary.Write(&b, binary.BigEndian, uint32(len(f)))
		b.Write(f)
	}
	binary.Write(&b, binary.BigEndian, r.IssuedAt.UnixNano())
	return b.Bytes()
}

// SignRotation makes the record that moves nodeID from old to next.
func SignRotation(nodeID string, old, next ed25519.PrivateKey, at time.Time) Rotation {
	r := Rotation{
		Version: RotationVersion, NodeID: nodeID, IssuedAt: at.UTC(),
		OldKey: old.Public().(ed25519.PublicKey), NewKey: next.Public().(ed25519.PublicKey),
	}
	msg := RotationBytes(r)
	r.OldSignature, r.NewSignature = ed25519.Sign(old, msg), ed25519.Sign(next, msg)
	return r
}

// VerifyRotation checks that r moves node nodeID's pinned key to another
// key: of this version and node, from pinned, signed by pinned and by the
// new key.
func VerifyRotation(r Rotation, nodeID string, pinned ed25519.PublicKey) error {
	switch {
	case r.Version != RotationVersion:
		return fmt.Errorf("%w: version %d, want %d", ErrRotation, r.Version, RotationVersion)
	case r.NodeID != nodeID:
		return fmt.Errorf("%w: it is for node %q, not %q", ErrRotation, r.NodeID, nodeID)
	case len(r.OldKey) != ed25519.PublicKeySize || len(r.NewKey) != ed25519.PublicKeySize:
		return fmt.Errorf("%w: keys of %d and %d bytes", ErrRotation, len(r.OldKey), len(r.NewKey))
	case !bytes.Equal(r.OldKey, pinned):
		return fmt.Errorf("%w: it rotates from key %x, not the pinned %x", ErrRotation, []byte(r.OldKey), []byte(pinned))
	case bytes.Equal(r.NewKey, r.OldKey):
		return fmt.Errorf("%w: the new key is the old one", ErrRotation)
	}
	msg := RotationBytes(r)
	if !ed25519.Verify(pinned, msg, r.OldSignature) {
		return fmt.Errorf("%w: not signed by the pinned key", ErrRotation)
	}
	if !ed25519.Verify(r.NewKey, msg, r.NewSignature) {
		return fmt.Errorf("%w: not signed by the new key", ErrRotation)
	}
	return nil
}
