// Package blockstore is the durable home of block-mode RootFS data: a
// device is cut into fixed-size chunks, each generation of a sandbox's
// device is a manifest (chunk index → object, parent generation, device
// size, checksums), and every object is immutable and authenticated-
// encrypted under a per-sandbox data key that a node key wraps.
//
// The objects live in a Store: a flat namespace of immutable objects by key
// with two backends, a local directory (dirstore, the default) and an
// S3-compatible bucket (s3store). storetest is the contract both pass.
package blockstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Store is an object store of immutable objects. Every implementation
// passes storetest.Run.
//
// An object is created once and never changes: Put of a key that exists
// fails with ErrExists and leaves the stored object as it was, so a stale
// writer can never replace a committed manifest or chunk. Put is atomic:
// a reader sees the whole object or ErrNotFound, never a part of it.
type Store interface {
	// Put creates the object key with data, or fails with ErrExists.
	Put(ctx context.Context, key string, data []byte) error
	// Get returns the whole object, or an error wrapping ErrNotFound.
	Get(ctx context.Context, key string) ([]byte, error)
	// Delete removes the object; deleting a missing key is not an error
	// (teardown is idempotent).
	Delete(ctx context.Context, key string) error
	// List returns the keys that start with prefix, sorted. The prefix
	// is a plain string prefix (as in S3), not only a directory.
	List(ctx context.Context, prefix string) ([]string, error)
}

// Lister is an optional Store extension GC needs: ListInfo is List with
// each object's size and modification time (the time its Put completed,
// by the store's clock), so GC can leave alone what may be an upload in
// flight.
type Lister interface {
	ListInfo(ctx context.Context, prefix string) ([]ObjectInfo, error)
}

// ObjectInfo is one object of a ListInfo.
type ObjectInfo struct {
	Key     string
	ModTime time.Time
	Size    int64
}

// BufferGetter is an optional Store extension for the chunk read path:
// GetBuffer is Get into buf's storage (a new slice if the object does not
// fit), so a read allocates nothing per object. buf's contents are
// overwritten.
type BufferGetter interface {
	GetBuffer(ctx context.Context, key string, buf []byte) ([]byte, error)
}

// RangeGetter is an optional Store extension for chunks stored in pack
// objects: GetRange reads exactly length bytes at off of the object key
// into buf's storage (a new slice if they do not fit). A read past the
// object's end is an error; length is at most MaxObjectSize(key), and
// no more than length bytes are ever read, whatever the backend sends.
// A Repo writes packs only to a store that is a RangeGetter.
type RangeGetter interface {
	GetRange(ctx context.Context, key string, off int64, length int, buf []byte) ([]byte, error)
}

// Packer is an optional Store extension for writing a pack object in
// appends, never all in memory (dirstore: one file, one fsync). Without
// it a Repo builds each pack in memory and Puts it whole.
type Packer interface {
	NewPack(ctx context.Context, key string) (PackWriter, error)
}

// PackWriter writes one new object by appends. Nothing is visible until
// Commit, which makes the whole object durable and then visible under its
// key (ErrExists if the key exists: the stored object stays); when it
// returns without error the object reads back whole and survives a
// crash. Abort drops it. A crash before Commit returns leaves no object
// or a whole one (and, in dirstore, a temp file Sweep removes).
type PackWriter interface {
	Write(p []byte) (int, error)
	Commit(ctx context.Context) error
	Abort()
}

var (
	// ErrNotFound: no object has this key.
	ErrNotFound = errors.New("object not found")
	// ErrExists: Put of a key that already holds an object.
	ErrExists = errors.New("object already exists")
	// ErrInvalidKey: the key breaks KeyRule.
	ErrInvalidKey = errors.New("invalid object key")
	// ErrCorrupt: an object failed authentication or decoding (tampered,
	// truncated, swapped, or sealed under another key). Its bytes are
	// never returned as data.
	ErrCorrupt = errors.New("corrupt object")
	// ErrTooLarge: an object is larger than MaxObjectSize of its key (a
	// tampered object or a hostile server); nothing of it is returned.
	ErrTooLarge = errors.New("object too large")
)

// Object size limits by kind (issue 21): a Store reads at most
// MaxObjectSize(key) bytes of an object, checked against the size the
// backend announces and enforced while reading, so a tampered object or a
// hostile server cannot make a reader allocate without bound before the
// object is authenticated.
const (
	// MaxChunkObject is a sealed chunk: at most MaxChunkSize of payload
	// (compression is kept only when it shrinks) plus the header, nonce
	// and tag.
	MaxChunkObject = MaxChunkSize + 4<<10
	// MaxManifestObject is a sealed manifest: 41 bytes per written chunk,
	// about 3.2 million chunks (200 GiB written at 64 KiB chunks). Also
	// the bound of a key of no known kind.
	MaxManifestObject = 128 << 20
	// MaxSmallObject is a head, snapshot, tombstone or wrapped data key.
	MaxSmallObject = 64 << 10
)

// A pack object (<volume kind>/<id>/packs/<32 hex>) is read by ranges of
// at most MaxChunkObject, never whole: its bound, MaxPackObject, is the
// manifest's (offsets are 32-bit).

// MaxObjectSize is the size limit of the object at key, by its kind
// (<volume kind>/<id>/chunks/..., /packs/..., /gen/..., /head/..., /snap/...,
// /deleted, /key).
func MaxObjectSize(key string) int64 {
	parts := strings.SplitN(key, "/", 4)
	if len(parts) < 3 {
		return MaxManifestObject
	}
	switch parts[2] {
	case "chunks":
		return MaxChunkObject
	case "gen":
		return MaxManifestObject
	case "packs":
		return MaxPackObject
	case "head", "snap", "deleted", "key":
		return MaxSmallObject
	}
	return MaxManifestObject
}

// MaxKeyLen bounds a key; S3 allows 1024 bytes, a path component 255.
const MaxKeyLen = 512

// KeyRule is the key rule in words, for error messages.
const KeyRule = "1-512 bytes of '/'-separated segments of A-Z a-z 0-9 . _ -, each 1-128 bytes and not starting with '.'"

// CheckKey checks key against KeyRule. Keys become paths in dirstore, so
// nothing that could traverse ("..", "/x", "a//b") or hide (".tmp") passes;
// a segment never starts with '.', which keeps dirstore's temp files out of
// the key space.
func CheckKey(key string) error {
	if len(key) == 0 || len(key) > MaxKeyLen {
		return fmt.Errorf("%w %q: %s", ErrInvalidKey, key, KeyRule)
	}
	for seg := range strings.SplitSeq(key, "/") {
		if len(seg) == 0 || len(seg) > 128 || seg[0] == '.' {
			return fmt.Errorf("%w %q: %s", ErrInvalidKey, key, KeyRule)
		}
		for i := 0; i < len(seg); i++ {
			c := seg[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
				return fmt.Errorf("%w %q: %s", ErrInvalidKey, key, KeyRule)
			}
		}
	}
	return nil
}

// CheckPrefix checks a List prefix: empty, or a key, or a key followed by
// '/' (so "a/b" and "a/b/" are both fine; "a/../" is not).
func CheckPrefix(prefix string) error {
	p := strings.TrimSuffix(prefix, "/")
	if p == "" {
		if prefix == "" {
			return nil
		}
		return fmt.Errorf("%w prefix %q: %s", ErrInvalidKey, prefix, KeyRule)
	}
	if err := CheckKey(p); err != nil {
		return fmt.Errorf("prefix: %w", err)
	}
	return nil
}
