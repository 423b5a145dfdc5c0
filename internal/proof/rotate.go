package proof

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/ctld/ctld/internal/fsutil"
)

// Files of a rotation in the identity dir.
const (
	rotationName = "rotation.json" // the last rotation (signed by the old and the new key)
	prevKeyName  = "node.key.prev" // the key before it, kept for the operator
)

// RotateIdentity gives the node in stateDir a new proof key: it signs a
// Rotation with the current key and the new one, writes it, keeps the
// current key as node.key.prev and puts the new key in its place, each
// file written whole (temp, fsync, rename, fsync the dir). A crash
// before the last step leaves the old key in place and a record that
// names another key, which loading ignores: run it again. The instances
// sign with the new key from their next start; managers that pinned the
// old key follow the record (the old key stays trusted for their
// overlap).
func RotateIdentity(stateDir string, now time.Time) (Rotation, error) {
	return rotateIdentity(stateDir, BootIDPath, now)
}

func rotateIdentity(stateDir, bootIDPath string, now time.Time) (Rotation, error) {
	dir := filepath.Join(stateDir, identityDir)
	id, err := loadOrCreateIdentity(stateDir, bootIDPath)
	if err != nil {
		return Rotation{}, fmt.Errorf("rotate node key: %w", err)
	}
	oldPEM, err := fsutil.ReadPrivate(filepath.Join(dir, keyName))
	if err != nil {
		return Rotation{}, fmt.Errorf("rotate node key: %w", err)
	}
	_, next, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return Rotation{}, fmt.Errorf("rotate node key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(next)
	if err != nil {
		return Rotation{}, fmt.Errorf("rotate node key: %w", err)
	}
	r := SignRotation(id.NodeID, id.Key, next, now)
	b, err := json.Marshal(r)
	if err != nil {
		return Rotation{}, fmt.Errorf("rotate node key: %w", err)
	}
	for _, f := range []struct {
		name string
		data []byte
		perm os.FileMode
	}{
		{rotationName, b, 0o644},
		{prevKeyName, oldPEM, 0o600},
		{keyName, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600},
	} {
		if err := fsutil.WriteFileAtomic(filepath.Join(dir, f.name), f.data, f.perm); err != nil {
			return Rotation{}, fmt.Errorf("rotate node key: %w", err)
		}
	}
	return r, nil
}

// loadRotation reads the record of the rotation to id's key, if there is
// one: a record that names another key (a rotation that did not finish,
// or one before the last) is none; one whose signatures do not hold is
// an error.
func loadRotation(dir string, id Identity) (*Rotation, error) {
	b, err := os.ReadFile(filepath.Join(dir, rotationName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read key rotation: %w", err)
	}
	var r Rotation
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("decode key rotation: %w", err)
	}
	if !r.NewKey.Equal(id.PublicKey()) {
		return nil, nil
	}
	if err := VerifyRotation(r, id.NodeID, r.OldKey); err != nil {
		return nil, fmt.Errorf("key rotation %s: %w", filepath.Join(dir, rotationName), err)
	}
	return &r, nil
}
