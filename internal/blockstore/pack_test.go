package blockstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/blockstore"
)

// commitPacked writes a packed generation of v's 16-chunk device: random
// chunks at 0..n-1, chunk n a copy of chunk 1, chunk n+1 zeros. It
// returns the device as it reads and the manifest.
func commitPacked(t *testing.T, r *blockstore.Repo, v blockstore.Volume, n int) ([]byte, *blockstore.Manifest) {
	t.Helper()
	ctx := context.Background()
	w, err := r.NewWriter(ctx, blockstore.CommitSpec{Generation: blockstore.GenRef{Volume: v}, DeviceSize: 16 * cs, ChunkSize: cs, Packed: true})
	if err != nil {
		t.Fatal(err)
	}
	dev := make([]byte, 16*cs)
	for i := range n {
		copy(dev[i*cs:], randChunk(t))
	}
	copy(dev[n*cs:], dev[cs:2*cs])
	for i := range n + 2 {
		if err := w.WriteChunk(ctx, uint64(i), dev[i*cs:(i+1)*cs]); err != nil {
			t.Fatal(err)
		}
	}
	m, err := w.Commit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return dev, m
}

// A packed generation: one pack object, no chunk object; a chunk written
// twice is packed once (both entries name one range); it reads back
// whole, as does a loose generation of a fork written over it.
func TestPackedCommitReads(t *testing.T) {
	onBackends(t, nil, func(t *testing.T, st blockstore.Store, r *blockstore.Repo) {
		ctx := context.Background()
		v := blockstore.Template("packed")
		dev, m := commitPacked(t, r, v, 6)
		if len(m.Packs) != 1 || len(m.Entries) != 7 {
			t.Fatalf("manifest: %d packs, %d entries; want 1 and 7 (the zero chunk is none)", len(m.Packs), len(m.Entries))
		}
		if a, b := m.Entries[1], m.Entries[6]; a.Pack != 1 || b.Pack != a.Pack || b.Offset != a.Offset || b.Length != a.Length {
			t.Fatalf("the repeated chunk: %+v and %+v; want one range", a, b)
		}
		keys := listAll(t, st)
		var packs, chunks int
		for _, k := range keys {
			packs += strings.Count(k, "/packs/")
			chunks += strings.Count(k, "/chunks/")
		}
		if packs != 1 || chunks != 0 {
			t.Fatalf("store %q: %d packs, %d chunk objects; want 1 and 0", keys, packs, chunks)
		}
		ref := blockstore.GenRef{Volume: v}
		if got := readAll(t, r, ref); !bytes.Equal(got, dev) {
			t.Fatal("the packed generation reads differently")
		}
		// A sandbox of it writes loose objects over the packs.
		sb := blockstore.Sandbox("over-packed")
		if _, err := r.Fork(ctx, ref, sb); err != nil {
			t.Fatal(err)
		}
		sb0 := blockstore.GenRef{Volume: sb}
		mine := randChunk(t)
		if _, err := r.Commit(ctx, blockstore.CommitSpec{Generation: blockstore.GenRef{Volume: sb, Generation: 1}, Parent: &sb0, DeviceSize: 16 * cs}, map[uint64][]byte{2: mine}); err != nil {
			t.Fatal(err)
		}
		copy(dev[2*cs:], mine)
		if got := readAll(t, r, blockstore.GenRef{Volume: sb, Generation: 1}); !bytes.Equal(got, dev) {
			t.Fatal("a loose generation over a packed one reads differently")
		}
	})
}

// A pack's bytes are authenticated chunk by chunk: a flipped bit, a
// chunk copied over another's range and a missing pack are ErrCorrupt
// (the buffer zeroed, never the stored bytes), and only the chunks hit.
func TestPackedTamperIsCorrupt(t *testing.T) {
	onBackends(t, nil, func(t *testing.T, st blockstore.Store, r *blockstore.Repo) {
		ctx := context.Background()
		v := blockstore.Template("tamper")
		dev, m := commitPacked(t, r, v, 6)
		key := fmt.Sprintf("%s/packs/%x", v, m.Packs[0])
		pack, err := st.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		e2, e3, e4 := m.Entries[2], m.Entries[3], m.Entries[4]
		if e3.Length != e4.Length {
			t.Fatalf("random chunks sealed to %d and %d bytes", e3.Length, e4.Length)
		}
		edited := bytes.Clone(pack)
		edited[e2.Offset+e2.Length/2] ^= 0x04
		copy(edited[e4.Offset:e4.Offset+e4.Length], pack[e3.Offset:e3.Offset+e3.Length])
		if err := st.Delete(ctx, key); err != nil {
			t.Fatal(err)
		}
		if err := st.Put(ctx, key, edited); err != nil {
			t.Fatal(err)
		}
		im, err := r.Open(ctx, blockstore.GenRef{Volume: v})
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, cs)
		for i := range uint64(8) {
			buf[0] = 0xff
			err := im.ReadChunk(ctx, i, buf)
			if i == 2 || i == 4 {
				if !errors.Is(err, blockstore.ErrCorrupt) || !bytes.Equal(buf, make([]byte, cs)) {
					t.Errorf("chunk %d, tampered: %v (buffer zeroed: %v); want ErrCorrupt", i, err, bytes.Equal(buf, make([]byte, cs)))
				}
				continue
			}
			if err != nil || !bytes.Equal(buf, dev[i*cs:(i+1)*cs]) {
				t.Errorf("chunk %d, untouched: %v", i, err)
			}
		}
		// Cut short inside one chunk's range (sealers pack in the order
		// they finish, so by offset): its range ends past the pack's end,
		// and the next one's starts past it, refused by the store.
		byOff := slices.Clone(m.Entries[:6])
		slices.SortFunc(byOff, func(a, b blockstore.Entry) int { return int(a.Offset) - int(b.Offset) })
		cut, past := byOff[3], byOff[4]
		if err := st.Delete(ctx, key); err != nil {
			t.Fatal(err)
		}
		if err := st.Put(ctx, key, edited[:cut.Offset+10]); err != nil {
			t.Fatal(err)
		}
		for _, i := range []uint64{cut.Index, past.Index} {
			if err := im.ReadChunk(ctx, i, buf); !errors.Is(err, blockstore.ErrCorrupt) {
				t.Errorf("chunk %d of a truncated pack: %v, want ErrCorrupt", i, err)
			}
		}
		if err := st.Delete(ctx, key); err != nil {
			t.Fatal(err)
		}
		if err := im.ReadChunk(ctx, 0, buf); !errors.Is(err, blockstore.ErrCorrupt) {
			t.Errorf("a chunk of a missing pack: %v, want ErrCorrupt", err)
		}
	})
}

// TestGCPacks: GC keeps a pack while a marked manifest lists it and frees the packs of
// a deleted template and a leftover pack no manifest lists (a crash
// between a pack's commit and its manifest), but only once older than
// the grace.
func TestGCPacks(t *testing.T) {
	onBackends(t, nil, func(t *testing.T, st blockstore.Store, r *blockstore.Repo) {
		ctx := context.Background()
		keep, gone := blockstore.Template("keep"), blockstore.Template("gone")
		dev, _ := commitPacked(t, r, keep, 5)
		commitPacked(t, r, gone, 3)
		if err := r.DeleteVolume(ctx, gone); err != nil {
			t.Fatal(err)
		}
		leftover := keep.String() + "/packs/00112233445566778899aabbccddeeff"
		if err := st.Put(ctx, leftover, []byte("a pack whose manifest never came")); err != nil {
			t.Fatal(err)
		}
		rep, err := r.GC(ctx, blockstore.GCOptions{Grace: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Deleted[blockstore.GCPack] != 0 || !slices.Contains(listAll(t, st), leftover) {
			t.Fatalf("GC within the grace deleted %v", rep.Deleted)
		}
		rep, err = r.GC(ctx, blockstore.GCOptions{Grace: time.Hour, Now: later})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Deleted[blockstore.GCPack] != 2 || rep.Kept[blockstore.GCPack] != 1 {
			t.Fatalf("GC deleted %v, kept %v; want 2 packs deleted, 1 kept", rep.Deleted, rep.Kept)
		}
		var left []string
		for _, k := range listAll(t, st) {
			if strings.Contains(k, "/packs/") {
				left = append(left, k)
			}
		}
		if len(left) != 1 || !strings.HasPrefix(left[0], keep.String()+"/") || left[0] == leftover {
			t.Fatalf("packs left: %q; want keep's own", left)
		}
		if got := readAll(t, r, blockstore.GenRef{Volume: keep}); !bytes.Equal(got, dev) {
			t.Fatal("the kept template reads differently after GC")
		}
	})
}

// packFailStore is a range-reading store without Packer (packs are built
// in memory and Put whole, as on S3) whose pack Puts fail.
type packFailStore struct {
	blockstore.Store
	rg blockstore.RangeGetter
}

func (s packFailStore) GetRange(ctx context.Context, key string, off int64, n int, buf []byte) ([]byte, error) {
	return s.rg.GetRange(ctx, key, off, n, buf)
}

func (s packFailStore) Put(ctx context.Context, key string, data []byte) error {
	if strings.Contains(key, "/packs/") {
		return errors.New("disk full")
	}
	return s.Store.Put(ctx, key, data)
}

// A pack that does not store fails the commit: no generation, no pack.
func TestPackedCommitFailsWithItsPack(t *testing.T) {
	f := newFixture(t, blockstore.Options{})
	st := packFailStore{Store: f.dir, rg: f.dir}
	r, err := blockstore.New(st, f.node, blockstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	v := blockstore.Template("fails")
	w, err := r.NewWriter(ctx, blockstore.CommitSpec{Generation: blockstore.GenRef{Volume: v}, DeviceSize: 16 * cs, ChunkSize: cs, Packed: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := range uint64(4) {
		if err := w.WriteChunk(ctx, i, randChunk(t)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.Commit(ctx); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("Commit = %v, want the pack's error", err)
	}
	if gens, err := r.Generations(ctx, v); err != nil || len(gens) != 0 {
		t.Fatalf("generations after a failed commit: %v, %v", gens, err)
	}
	for _, k := range listAll(t, f.dir) {
		if strings.Contains(k, "/packs/") {
			t.Fatalf("a pack after a failed commit: %s", k)
		}
	}
}

// Eight sealers at once over 96 chunks of 12 contents, written from one
// buffer the caller overwrites after each call: every chunk reads back as
// written, each content is packed once (the pack holds 12 sealed chunks),
// and repeats name one range.
func TestPackedSealersInParallel(t *testing.T) {
	f := newFixture(t, blockstore.Options{Sealers: 8})
	ctx := context.Background()
	v := blockstore.Template("parallel")
	const n, kinds = 96, 12
	w, err := f.repo.NewWriter(ctx, blockstore.CommitSpec{Generation: blockstore.GenRef{Volume: v}, DeviceSize: n * cs, ChunkSize: cs, Packed: true})
	if err != nil {
		t.Fatal(err)
	}
	contents := make([][]byte, kinds)
	for k := range contents {
		contents[k] = randChunk(t)
	}
	dev := make([]byte, n*cs)
	buf := make([]byte, cs)
	for i := range n {
		copy(buf, contents[i%kinds])
		copy(dev[i*cs:], buf)
		if err := w.WriteChunk(ctx, uint64(i), buf); err != nil {
			t.Fatal(err)
		}
		clear(buf) // WriteChunk copied what it seals later
	}
	m, err := w.Commit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, f.repo, blockstore.GenRef{Volume: v}); !bytes.Equal(got, dev) {
		t.Fatal("the generation sealed in parallel reads differently")
	}
	ranges := map[[2]uint32]bool{}
	var packed int64
	for _, e := range m.Entries {
		if r := [2]uint32{e.Offset, e.Length}; !ranges[r] {
			ranges[r] = true
			packed += int64(e.Length)
		}
		if first := m.Entries[int(e.Index)%kinds]; first.Offset != e.Offset || first.Length != e.Length {
			t.Fatalf("chunk %d at %d+%d, its first copy (chunk %d) at %d+%d: want one range", e.Index, e.Offset, e.Length, first.Index, first.Offset, first.Length)
		}
	}
	if len(m.Packs) != 1 || len(ranges) != kinds {
		t.Fatalf("%d packs, %d ranges: want 1 and %d", len(m.Packs), len(ranges), kinds)
	}
	var size int64
	for _, k := range listAll(t, f.dir) {
		if strings.Contains(k, "/packs/") {
			b, err := f.dir.Get(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			size = int64(len(b))
		}
	}
	if size != packed {
		t.Fatalf("pack of %d bytes, the entries' distinct ranges %d: want every content packed once", size, packed)
	}
}
