package blockstore

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"sync"
)

// KeySize is the size of node keys and data keys: AES-256.
const KeySize = 32

// keyIDPattern: key IDs go in object headers and error messages.
var keyIDPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// CheckKeyID checks a node or data key ID: 1-63 of a-z 0-9 '-', not
// starting with '-'.
func CheckKeyID(id string) error {
	if !keyIDPattern.MatchString(id) {
		return fmt.Errorf("%w: key id %q must be 1-63 of a-z 0-9 '-', not starting with '-'", ErrInvalidKey, id)
	}
	return nil
}

// NodeKey is a key-encryption key: it wraps the data keys of the volumes
// (AES-256-GCM, the AAD naming node key, data key and volume), so the
// store alone never holds a usable key.
type NodeKey struct {
	id   string
	aead cipher.AEAD
}

// NewNodeKey returns the node key id with the 32 bytes key.
func NewNodeKey(id string, key []byte) (*NodeKey, error) {
	if err := CheckKeyID(id); err != nil {
		return nil, fmt.Errorf("node key: %w", err)
	}
	if len(key) != KeySize {
		return nil, fmt.Errorf("node key %s: %d bytes, want %d", id, len(key), KeySize)
	}
	aead, err := newAEAD(key)
	if err != nil {
		return nil, fmt.Errorf("node key %s: %w", id, err)
	}
	return &NodeKey{id: id, aead: aead}, nil
}

// GenerateNodeKey returns a new random node key and its bytes (to be kept
// by the caller, e.g. beside the node identity, mode 0600).
func GenerateNodeKey(id string) (*NodeKey, []byte, error) {
	key := make([]byte, KeySize)
	if _, err := rand.Read(key); err != nil {
		return nil, nil, fmt.Errorf("generate node key: %w", err)
	}
	nk, err := NewNodeKey(id, key)
	return nk, key, err
}

// ID is the node key's ID.
func (n *NodeKey) ID() string { return n.id }

// DataKey is a volume's data key. Its secret never leaves the process
// unwrapped; two subkeys are derived from it (HKDF-SHA256): the AEAD key
// that seals objects and the MAC key that names chunks by content.
type DataKey struct {
	id     string
	volume Volume
	aead   cipher.AEAD
	macKey []byte
}

// ID is the data key's ID (random, in every object header it seals).
func (d *DataKey) ID() string { return d.id }

// Volume is the volume the key belongs to.
func (d *DataKey) Volume() Volume { return d.volume }

func newDataKey(id string, vol Volume, secret []byte) (*DataKey, error) {
	encKey, err := hkdf.Key(sha256.New, secret, nil, "ctld-blockstore/v1 object aead", KeySize)
	if err != nil {
		return nil, fmt.Errorf("derive data key %s: %w", id, err)
	}
	macKey, err := hkdf.Key(sha256.New, secret, nil, "ctld-blockstore/v1 chunk mac", KeySize)
	if err != nil {
		return nil, fmt.Errorf("derive data key %s: %w", id, err)
	}
	aead, err := newAEAD(encKey)
	if err != nil {
		return nil, fmt.Errorf("data key %s: %w", id, err)
	}
	return &DataKey{id: id, volume: vol, aead: aead, macKey: macKey}, nil
}

func newAEAD(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// The wrapped data key, as stored at <volume>/key:
//
//	"CTBK" | version 1 | str nodeKeyID | str dataKeyID | str volume | nonce(12) | seal(secret)
//
// with the AAD = everything before the nonce, so the blob cannot be moved
// to another volume or be read as another key.
const (
	wrapMagic   = "CTBK"
	wrapVersion = 1
)

func (n *NodeKey) wrap(id string, vol Volume, secret []byte) ([]byte, error) {
	var e encoder
	e.raw([]byte(wrapMagic))
	e.u8(wrapVersion)
	e.str(n.id)
	e.str(id)
	e.str(vol.String())
	hdr := e.bytes()
	nonce := make([]byte, n.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("wrap data key: %w", err)
	}
	out := append(append([]byte{}, hdr...), nonce...)
	return n.aead.Seal(out, nonce, secret, hdr), nil
}

// ErrWrongNodeKey: a wrapped data key was wrapped by another node key than
// the one at hand.
var ErrWrongNodeKey = errors.New("data key wrapped by another node key")

func (n *NodeKey) unwrap(vol Volume, blob []byte) (*DataKey, error) {
	d := decoder{b: blob}
	if string(d.raw(len(wrapMagic))) != wrapMagic || d.u8() != wrapVersion {
		return nil, fmt.Errorf("%w: wrapped key of %s: bad magic or version", ErrCorrupt, vol)
	}
	nodeID, id, volName := d.str(), d.str(), d.str()
	if d.err != nil {
		return nil, fmt.Errorf("%w: wrapped key of %s: truncated header", ErrCorrupt, vol)
	}
	hdr := blob[:d.off]
	nonce := d.raw(n.aead.NonceSize())
	if d.err != nil {
		return nil, fmt.Errorf("%w: wrapped key of %s: truncated", ErrCorrupt, vol)
	}
	if nodeID != n.id {
		return nil, fmt.Errorf("%w: key of %s is wrapped by node key %q, have %q", ErrWrongNodeKey, vol, nodeID, n.id)
	}
	if volName != vol.String() {
		return nil, fmt.Errorf("%w: wrapped key of %s names volume %q", ErrCorrupt, vol, volName)
	}
	if err := CheckKeyID(id); err != nil {
		return nil, fmt.Errorf("%w: wrapped key of %s: %v", ErrCorrupt, vol, err)
	}
	secret, err := n.aead.Open(nil, nonce, blob[d.off:], hdr)
	if err != nil || len(secret) != KeySize {
		return nil, fmt.Errorf("%w: wrapped key of %s fails authentication", ErrCorrupt, vol)
	}
	return newDataKey(id, vol, secret)
}

// Keyring finds and creates the data keys of volumes: one per volume,
// wrapped by the node key, stored as the object <volume>/key (created once:
// of two racing creators one wins and the other uses the winner's key).
// Unwrapped keys are cached. Safe for concurrent use.
type Keyring struct {
	store Store
	node  *NodeKey
	mu    sync.Mutex
	keys  map[Volume]*DataKey
}

// NewKeyring returns a keyring over store with node key node.
func NewKeyring(store Store, node *NodeKey) *Keyring {
	return &Keyring{store: store, node: node, keys: map[Volume]*DataKey{}}
}

func keyObject(vol Volume) string { return vol.String() + "/key" }

// Get returns the data key of vol; an error wrapping ErrNotFound if it has
// none.
func (k *Keyring) Get(ctx context.Context, vol Volume) (*DataKey, error) {
	k.mu.Lock()
	dk := k.keys[vol]
	k.mu.Unlock()
	if dk != nil {
		return dk, nil
	}
	blob, err := k.store.Get(ctx, keyObject(vol))
	if err != nil {
		return nil, fmt.Errorf("data key of %s: %w", vol, err)
	}
	dk, err = k.node.unwrap(vol, blob)
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if have := k.keys[vol]; have != nil {
		return have, nil
	}
	k.keys[vol] = dk
	return dk, nil
}

// Ensure returns the data key of vol, creating it if vol has none.
func (k *Keyring) Ensure(ctx context.Context, vol Volume) (*DataKey, error) {
	dk, err := k.Get(ctx, vol)
	if err == nil || !errors.Is(err, ErrNotFound) {
		return dk, err
	}
	secret := make([]byte, KeySize)
	idb := make([]byte, 8)
	if _, err := rand.Read(secret); err != nil {
		return nil, fmt.Errorf("create data key of %s: %w", vol, err)
	}
	if _, err := rand.Read(idb); err != nil {
		return nil, fmt.Errorf("create data key of %s: %w", vol, err)
	}
	id := "dk-" + hex.EncodeToString(idb)
	blob, err := k.node.wrap(id, vol, secret)
	if err != nil {
		return nil, err
	}
	if err := k.store.Put(ctx, keyObject(vol), blob); err != nil {
		if errors.Is(err, ErrExists) {
			return k.Get(ctx, vol) // a concurrent creator won
		}
		return nil, fmt.Errorf("create data key of %s: %w", vol, err)
	}
	return k.Get(ctx, vol)
}
