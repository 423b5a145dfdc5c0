package blockstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"sort"
	"strings"
	"sync"
	"testing"
)

// memStore is a map Store for the package's own tests (the real backends
// import this package, so its internal tests cannot use them).
type memStore struct {
	mu   sync.Mutex
	objs map[string][]byte
}

func (m *memStore) Put(_ context.Context, key string, data []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.objs[key]; ok {
		return ErrExists
	}
	m.objs[key] = bytes.Clone(data)
	return nil
}

func (m *memStore) Get(_ context.Context, key string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.objs[key]
	if !ok {
		return nil, ErrNotFound
	}
	return bytes.Clone(b), nil
}

func (m *memStore) Delete(_ context.Context, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.objs, key)
	return nil
}

func (m *memStore) List(_ context.Context, prefix string) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var keys []string
	for k := range m.objs {
		if strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys, nil
}

// A chunk object that authenticates (sealed under the right key, at the
// right name) but holds other data than the manifest's checksum names is
// still a read error: the keyed checksum is checked after decryption.
func TestReadChecksChecksumAfterDecrypt(t *testing.T) {
	ctx := context.Background()
	ms := &memStore{objs: map[string][]byte{}}
	nk, _, _ := GenerateNodeKey("node-a")
	r, err := New(ms, nk, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ref := GenRef{Volume: Template("t"), Generation: 0}
	c := make([]byte, MinChunkSize)
	rand.Read(c)
	if _, err := r.Commit(ctx, CommitSpec{Generation: ref, DeviceSize: MinChunkSize, ChunkSize: MinChunkSize}, map[uint64][]byte{0: c}); err != nil {
		t.Fatal(err)
	}
	dk, _ := r.keys.Get(ctx, ref.Volume)
	key := chunkKey(ref.Volume, dk.sum(c))
	other := make([]byte, MinChunkSize)
	rand.Read(other)
	forged, _ := r.codec.seal(dk, kindChunk, key, other)
	ms.objs[key] = forged
	im, err := r.Open(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, MinChunkSize)
	if err := im.ReadChunk(ctx, 0, buf); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("forged chunk: ReadChunk = %v, want a checksum ErrCorrupt", err)
	}
	if !bytes.Equal(buf, make([]byte, MinChunkSize)) {
		t.Fatal("forged chunk's bytes left in the buffer")
	}
}
