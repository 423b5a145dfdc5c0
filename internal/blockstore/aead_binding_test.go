package blockstore_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"os"
	"testing"

	"github.com/ctld/ctld/internal/blockstore"
)

// The read path checks no keyed checksum of a chunk's plaintext: the
// object's AEAD, keyed by the volume's data key and with the object's name
// (volume and content sum, which the authenticated manifest gives for the
// chunk index) in its additional data, is the whole check. These are the
// cases such a checksum would catch; each must still be a read error
// (ErrCorrupt, the buffer zeros), caught by the AEAD alone: a flip of any
// byte, a truncation to any length, bytes appended, and an intact object
// moved to another chunk's name: another index of the same generation,
// the same index of another generation, another volume (a sandbox's or
// the template's, even with the same content), or a manifest's name.
func TestChunkReadsNeedTheObjectSealedForTheirName(t *testing.T) {
	ctx := context.Background()
	// Text compresses (an S2 object, the default), random data does not: both kinds.
	text := func(seed byte) []byte {
		b := make([]byte, cs)
		for i := range b {
			b[i] = "ctld block "[i%11] + seed
		}
		return b
	}
	a, b, c := text(1), randChunk(t), text(2)
	sb2b := blockstore.GenRef{Volume: blockstore.Sandbox("sb-2"), Generation: 1}
	type world struct {
		f *fixture
		// want[ref][i]: what chunk i of ref reads as.
		want map[blockstore.GenRef]map[uint64][]byte
	}
	setup := func(t *testing.T) world {
		f := newFixture(t, blockstore.Options{Compression: blockstore.CompressS2})
		commit := func(spec blockstore.CommitSpec, chunks map[uint64][]byte) {
			t.Helper()
			if _, err := f.repo.Commit(ctx, spec, chunks); err != nil {
				t.Fatal(err)
			}
		}
		commit(blockstore.CommitSpec{Generation: tpl0, DeviceSize: 3 * cs, ChunkSize: cs}, map[uint64][]byte{0: a, 1: b})
		commit(blockstore.CommitSpec{Generation: sb1, Parent: &tpl0, DeviceSize: 3 * cs}, map[uint64][]byte{0: b, 2: c})
		commit(blockstore.CommitSpec{Generation: sb2, Parent: &sb1, DeviceSize: 3 * cs}, map[uint64][]byte{0: a, 2: b})
		commit(blockstore.CommitSpec{Generation: sb2b, Parent: &tpl0, DeviceSize: 3 * cs}, map[uint64][]byte{1: a, 2: c})
		return world{f: f, want: map[blockstore.GenRef]map[uint64][]byte{
			tpl0: {0: a, 1: b, 2: nil},
			sb1:  {0: b, 1: b, 2: c},
			sb2:  {0: a, 1: b, 2: b},
			sb2b: {0: a, 1: a, 2: c},
		}}
	}
	// objectOf is the name of the object chunk i of ref reads (from the
	// manifest chain, newest first).
	objectOf := func(t *testing.T, w world, ref blockstore.GenRef, i uint64) string {
		t.Helper()
		for ref := &ref; ref != nil; {
			m, err := w.f.repo.Manifest(ctx, *ref)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range m.Entries {
				if e.Index == i && e.Kind == blockstore.EntryData {
					h := hex.EncodeToString(e.Sum[:])
					return ref.Volume.String() + "/chunks/" + h[:2] + "/" + h
				}
			}
			ref = m.Parent
		}
		t.Fatalf("chunk %d of %s has no object", i, ref)
		return ""
	}
	// check reads every chunk of every generation: the damaged one (ref,
	// i) must fail with ErrCorrupt and leave zeros; every read that
	// succeeds must be exact.
	check := func(t *testing.T, w world, what string, ref blockstore.GenRef, i uint64) {
		t.Helper()
		failed := false
		for r, chunks := range w.want {
			im, err := w.f.repo.Open(ctx, r)
			if err != nil {
				t.Fatalf("%s: open %s: %v", what, r, err)
			}
			for j := range uint64(3) {
				buf := bytes.Repeat([]byte{0xAA}, cs)
				err := im.ReadChunk(ctx, j, buf)
				want := chunks[j]
				if want == nil {
					want = make([]byte, cs)
				}
				switch {
				case err == nil && !bytes.Equal(buf, want):
					t.Fatalf("%s: chunk %d of %s: wrong data without an error", what, j, r)
				case err != nil && !errors.Is(err, blockstore.ErrCorrupt):
					t.Fatalf("%s: chunk %d of %s: %v, want ErrCorrupt", what, j, r, err)
				case err != nil && !bytes.Equal(buf, make([]byte, cs)):
					t.Fatalf("%s: chunk %d of %s: a failed read left bytes in the buffer", what, j, r)
				case err != nil && r == ref && j == i:
					failed = true
				}
			}
		}
		if !failed {
			t.Fatalf("%s: chunk %d of %s read without an error", what, i, ref)
		}
	}
	put := func(t *testing.T, w world, key string, blob []byte) {
		t.Helper()
		if err := os.WriteFile(objFile(w.f, key), blob, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	get := func(t *testing.T, w world, key string) []byte {
		t.Helper()
		blob, err := os.ReadFile(objFile(w.f, key))
		if err != nil {
			t.Fatal(err)
		}
		return blob
	}

	t.Run("every byte flipped, every truncation, appended bytes", func(t *testing.T) {
		// Chunk 0 of sb-1 (random: stored raw) and chunk 2 (text: S2).
		for _, i := range []uint64{0, 2} {
			w := setup(t)
			key := objectOf(t, w, sb1, i)
			orig := get(t, w, key)
			if i == 2 && len(orig) >= cs {
				t.Fatalf("text chunk stored in %d bytes: not compressed", len(orig))
			}
			// One image, reopened per damage only for the chunk at stake
			// (the store is read at every ReadChunk; nothing is cached).
			im, err := w.f.repo.Open(ctx, sb1)
			if err != nil {
				t.Fatal(err)
			}
			path := objFile(w.f, key)
			damaged := func(what string, edit func(*os.File) error) {
				t.Helper()
				// In place: a rewrite per case is slow on this filesystem.
				fh, err := os.OpenFile(path, os.O_WRONLY, 0)
				if err == nil {
					err = errors.Join(edit(fh), fh.Close())
				}
				if err != nil {
					t.Fatal(err)
				}
				buf := bytes.Repeat([]byte{0xAA}, cs)
				err = im.ReadChunk(ctx, i, buf)
				if !errors.Is(err, blockstore.ErrCorrupt) || !bytes.Equal(buf, make([]byte, cs)) {
					t.Fatalf("%s: chunk %d: %v (zeroed %v), want ErrCorrupt and zeros", what, i, err, bytes.Equal(buf, make([]byte, cs)))
				}
			}
			restore := func(fh *os.File) error {
				if err := fh.Truncate(int64(len(orig))); err != nil {
					return err
				}
				_, err := fh.WriteAt(orig, 0)
				return err
			}
			// Every byte of the header, nonce and tag, and a stride through
			// the ciphertext (the codec's own test flips every byte).
			var offs []int
			for off := range orig {
				if off < 64 || off >= len(orig)-32 || off%37 == 0 {
					offs = append(offs, off)
				}
			}
			for _, off := range offs {
				damaged("flip", func(fh *os.File) error {
					if err := restore(fh); err != nil {
						return err
					}
					_, err := fh.WriteAt([]byte{orig[off] ^ 0x01}, int64(off))
					return err
				})
			}
			for _, off := range offs {
				damaged("truncate", func(fh *os.File) error {
					if err := restore(fh); err != nil {
						return err
					}
					return fh.Truncate(int64(off))
				})
			}
			damaged("append 1", func(fh *os.File) error {
				if err := restore(fh); err != nil {
					return err
				}
				_, err := fh.WriteAt([]byte{0}, int64(len(orig)))
				return err
			})
			damaged("append 16", func(fh *os.File) error {
				if err := restore(fh); err != nil {
					return err
				}
				_, err := fh.WriteAt(make([]byte, 16), int64(len(orig)))
				return err
			})
			// Every chunk of every generation read with that damage left in.
			check(t, w, "16 bytes appended", sb1, i)
			put(t, w, key, orig)
			buf := make([]byte, cs)
			if err := im.ReadChunk(ctx, i, buf); err != nil || !bytes.Equal(buf, w.want[sb1][i]) {
				t.Fatalf("restored object: %v", err)
			}
		}
	})
	t.Run("moved between chunk indexes of a generation", func(t *testing.T) {
		w := setup(t)
		// sb-1: chunk 0 (b, its own object) and chunk 2 (c).
		k0, k2 := objectOf(t, w, sb1, 0), objectOf(t, w, sb1, 2)
		o0, o2 := get(t, w, k0), get(t, w, k2)
		put(t, w, k2, o0)
		check(t, w, "chunk 0's object as chunk 2's", sb1, 2)
		put(t, w, k2, o2)
		put(t, w, k0, o2)
		check(t, w, "chunk 2's object as chunk 0's", sb1, 0)
	})
	t.Run("replayed across generations", func(t *testing.T) {
		w := setup(t)
		// Chunk 0 is b in generation 1 and a in generation 2 (same volume):
		// generation 1's object replayed as generation 2's, and back.
		k1, k2 := objectOf(t, w, sb1, 0), objectOf(t, w, sb2, 0)
		if k1 == k2 {
			t.Fatal("generations share chunk 0's object")
		}
		o1, o2 := get(t, w, k1), get(t, w, k2)
		put(t, w, k2, o1)
		check(t, w, "generation 1's chunk as generation 2's", sb2, 0)
		put(t, w, k2, o2)
		put(t, w, k1, o2)
		check(t, w, "generation 2's chunk as generation 1's", sb1, 0)
	})
	t.Run("moved between volumes, same content", func(t *testing.T) {
		w := setup(t)
		// c is chunk 2 of sb-1 and of sb-2: sealed once per volume, each
		// under its own data key and name.
		mine, theirs := objectOf(t, w, sb1, 2), objectOf(t, w, sb2b, 2)
		put(t, w, mine, get(t, w, theirs))
		check(t, w, "sb-2's object of the same content", sb1, 2)
		// a is chunk 0 of the template and chunk 1 of sb-2.
		w = setup(t)
		tk, sk := objectOf(t, w, tpl0, 0), objectOf(t, w, sb2b, 1)
		put(t, w, tk, get(t, w, sk))
		check(t, w, "a sandbox's object as the template's", tpl0, 0)
		w = setup(t) // a new data key: new names
		tk, sk = objectOf(t, w, tpl0, 0), objectOf(t, w, sb2b, 1)
		put(t, w, sk, get(t, w, tk))
		check(t, w, "the template's object as a sandbox's", sb2b, 1)
	})
	t.Run("a manifest in a chunk's place", func(t *testing.T) {
		w := setup(t)
		put(t, w, objectOf(t, w, sb1, 2), get(t, w, "sandboxes/sb-1/gen/00000000000000000001"))
		check(t, w, "manifest as chunk", sb1, 2)
	})
}
