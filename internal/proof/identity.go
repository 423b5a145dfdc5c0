// Package proof holds the node identity (node id, boot id, ed25519 signing
// key) and signs and verifies cleanup proofs (DESIGN.md, invariant 3: capacity
// comes back only after a proof shows the old holder is physically gone).
//
// A proof is its own versioned record (Proof), not the API's type: the
// signature covers SignedBytes, a payload fixed per version (see payloadV1:
// compact JSON of version, operation_id, node_id, boot_id, epoch,
// sandbox_id, generation, lease_id, checks, clean, time, node_key and a null
// signature, in that order), so a change of the API's JSON never changes
// what a signature covers. Version 0 is the payload of the proofs made
// before versions (the same without "version"); Verify accepts both.
package proof

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/ctld/ctld/internal/fsutil"
)

// BootIDPath is where the kernel publishes the current boot's id.
const BootIDPath = "/proc/sys/kernel/random/boot_id"

const (
	identityDir = "identity"
	nodeIDName  = "node-id"
	keyName     = "node.key"
)

var nodeIDPattern = regexp.MustCompile(`^[0-9a-f]{32}$`)

// Identity is who signs this node's proofs. NodeID and Key are created once
// per state dir and shared by both instances; BootID changes every boot.
type Identity struct {
	NodeID, BootID string
	Key            ed25519.PrivateKey
	// Rotation is the signed record of the rotation that made Key the
	// node's key (RotateIdentity), presented to managers that pinned the
	// key before it; nil if Key was never rotated to.
	Rotation *Rotation
}

// PublicKey is the key a verifier trusts for this node.
func (id Identity) PublicKey() ed25519.PublicKey {
	return id.Key.Public().(ed25519.PublicKey)
}

// LoadOrCreateIdentity loads <stateDir>/identity/{node-id,node.key}, creating
// each the first time. Creation never replaces an existing file, so two
// instances starting together end up with the same identity.
func LoadOrCreateIdentity(stateDir string) (Identity, error) {
	return loadOrCreateIdentity(stateDir, BootIDPath)
}

func loadOrCreateIdentity(stateDir, bootIDPath string) (Identity, error) {
	dir := filepath.Join(stateDir, identityDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Identity{}, fmt.Errorf("create identity dir: %w", err)
	}
	idBytes, err := fsutil.LoadOrCreate(filepath.Join(dir, nodeIDName), 0o644, os.ReadFile, func() ([]byte, error) {
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			return nil, err
		}
		return []byte(hex.EncodeToString(b) + "\n"), nil
	})
	if err != nil {
		return Identity{}, err
	}
	nodeID := strings.TrimSpace(string(idBytes))
	if !nodeIDPattern.MatchString(nodeID) {
		return Identity{}, fmt.Errorf("parse node id %q: want 32 lowercase hex digits", nodeID)
	}
	keyPath := filepath.Join(dir, keyName)
	// ReadPrivate refuses a key others could read: it can sign proofs in
	// our name.
	keyPEM, err := fsutil.LoadOrCreate(keyPath, 0o600, fsutil.ReadPrivate, func() ([]byte, error) {
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, err
		}
		der, err := x509.MarshalPKCS8PrivateKey(priv)
		if err != nil {
			return nil, err
		}
		return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
	})
	if err != nil {
		return Identity{}, err
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return Identity{}, fmt.Errorf("parse node key %s: %w", keyPath, err)
	}
	boot, err := os.ReadFile(bootIDPath)
	if err != nil {
		return Identity{}, fmt.Errorf("read boot id: %w", err)
	}
	bootID := strings.TrimSpace(string(boot))
	if bootID == "" {
		return Identity{}, fmt.Errorf("read boot id: %s is empty", bootIDPath)
	}
	id := Identity{NodeID: nodeID, BootID: bootID, Key: key}
	id.Rotation, err = loadRotation(dir, id)
	if err != nil {
		return Identity{}, err
	}
	return id, nil
}

func parseKey(b []byte) (ed25519.PrivateKey, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "PRIVATE KEY" {
		return nil, errors.New("no PEM PRIVATE KEY block")
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, err
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("key is %T, want ed25519", k)
	}
	return priv, nil
}
