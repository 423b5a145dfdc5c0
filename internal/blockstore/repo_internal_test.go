package blockstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
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

// pooledMemStore is a memStore with GetBuffer: the pooled read path
// (objects read into recycled buffers, decrypted in place).
type pooledMemStore struct{ *memStore }

func (m pooledMemStore) GetBuffer(_ context.Context, key string, buf []byte) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.objs[key]
	if !ok {
		return nil, ErrNotFound
	}
	return append(buf[:0], b...), nil
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

// Why the read path checks no keyed checksum of a chunk's plaintext: an
// object that opens under the volume's data key at the chunk's name can
// only come from a holder of that data key (every other forgery, swap or
// replay fails the AEAD: TestChunkReadsNeedTheObjectSealedForTheirName),
// and a holder of the data key forges the generation's manifest just as
// well, naming whatever content it seals; a checksum of the plaintext
// against the manifest's sum stops neither. This pins that premise: with
// the data key alone, a forged manifest and chunk read back as the
// forger's data, through the manifest's own sum.
func TestDataKeyHolderCanForgeTheManifestToo(t *testing.T) {
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
	m, err := r.Commit(ctx, CommitSpec{Generation: ref, DeviceSize: MinChunkSize, ChunkSize: MinChunkSize}, map[uint64][]byte{0: c})
	if err != nil {
		t.Fatal(err)
	}
	dk, _ := r.keys.Get(ctx, ref.Volume)
	other := make([]byte, MinChunkSize)
	rand.Read(other)
	sum := dk.sum(other)
	forgedChunk, _ := r.codec.seal(dk, kindChunk, chunkKey(ref.Volume, sum), other)
	ms.objs[chunkKey(ref.Volume, sum)] = forgedChunk
	fm := *m
	fm.Entries = []Entry{{Index: 0, Kind: EntryData, Sum: sum}}
	enc, err := fm.Encode()
	if err != nil {
		t.Fatal(err)
	}
	forgedManifest, _ := r.codec.seal(dk, kindManifest, manifestKey(ref), enc)
	ms.objs[manifestKey(ref)] = forgedManifest
	im, err := r.Open(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, MinChunkSize)
	if err := im.ReadChunk(ctx, 0, buf); err != nil || !bytes.Equal(buf, other) {
		t.Fatalf("forged manifest and chunk: ReadChunk = %v; the premise (a data-key holder forges manifests) no longer holds: revisit the read path's checks", err)
	}
}

// Chunk object names are what stores already hold: <volume>/chunks/<first
// byte of the sum, hex>/<sum, hex>.
func TestChunkKeyFormat(t *testing.T) {
	var sum [32]byte
	rand.Read(sum[:])
	for _, v := range []Volume{Template("busybox"), Sandbox("sb-1")} {
		h := hex.EncodeToString(sum[:])
		if got, want := chunkKey(v, sum), v.String()+"/chunks/"+h[:2]+"/"+h; got != want {
			t.Fatalf("chunkKey = %q, want %q", got, want)
		}
	}
}

// A compressed chunk object decodes through a buffer of its own (zstd:
// room for the decoder's block copies) or straight into the caller's (S2)
// and is taken only when it is a chunk's size: one that decodes shorter or
// longer (sealable only with the data key) is ErrCorrupt, the buffer all
// zeros and nothing past it written.
func TestCompressedChunkOfWrongSizeIsCorrupt(t *testing.T) {
	for _, tc := range []struct {
		compress Compression
		flag     uint8
		pooled   bool
	}{{CompressZstd, flagZstd, false}, {CompressZstd, flagZstd, true}, {CompressS2, flagS2, false}, {CompressS2, flagS2, true}} {
		t.Run(fmt.Sprintf("%s pooled=%v", tc.compress, tc.pooled), func(t *testing.T) {
			ctx := context.Background()
			ms := &memStore{objs: map[string][]byte{}}
			var st Store = ms
			if tc.pooled {
				st = pooledMemStore{ms}
			}
			nk, _, _ := GenerateNodeKey("node-a")
			r, err := New(st, nk, Options{Compression: tc.compress})
			if err != nil {
				t.Fatal(err)
			}
			ref := GenRef{Volume: Template("t"), Generation: 0}
			text := func(n int) []byte {
				return bytes.Repeat([]byte("/usr/lib/x86_64-linux-gnu/libc.so.6 0644\n"), n/41+1)[:n]
			}
			c := text(MinChunkSize)
			if _, err := r.Commit(ctx, CommitSpec{Generation: ref, DeviceSize: MinChunkSize, ChunkSize: MinChunkSize}, map[uint64][]byte{0: c}); err != nil {
				t.Fatal(err)
			}
			dk, _ := r.keys.Get(ctx, ref.Volume)
			key := chunkKey(ref.Volume, dk.sum(c))
			im, err := r.Open(ctx, ref)
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range []int{MinChunkSize, MinChunkSize - 1, 100, MinChunkSize + 1, 3 * MinChunkSize} {
				obj, err := r.codec.seal(dk, kindChunk, key, text(n))
				if err != nil || obj[len(objMagic)+2] != tc.flag {
					t.Fatalf("seal of %d bytes of text: %v, or not compressed with %s", n, err, tc.compress)
				}
				ms.objs[key] = obj
				// The chunk's buffer, then bytes the caller owns.
				back := bytes.Repeat([]byte{0xee}, 2*MinChunkSize)
				buf := back[:MinChunkSize]
				err = im.ReadChunk(ctx, 0, buf)
				switch {
				case n == MinChunkSize && (err != nil || !bytes.Equal(buf, c)):
					t.Fatalf("a chunk-sized object: %v, or other bytes", err)
				case n != MinChunkSize && !errors.Is(err, ErrCorrupt):
					t.Fatalf("an object of %d bytes: %v, want ErrCorrupt", n, err)
				case n != MinChunkSize && !bytes.Equal(buf, make([]byte, MinChunkSize)):
					t.Fatalf("an object of %d bytes left its bytes in the buffer", n)
				case !bytes.Equal(back[MinChunkSize:], bytes.Repeat([]byte{0xee}, MinChunkSize)):
					t.Fatalf("an object of %d bytes: bytes past the buffer written", n)
				}
			}
		})
	}
}
