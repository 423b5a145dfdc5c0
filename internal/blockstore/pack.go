package blockstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
)

// Pack objects: a Writer of a CommitSpec with Packed appends its sealed
// chunks to pack objects, v/packs/<32 hex, random>, instead of writing an
// object per chunk, and its manifest (version 2) lists the packs and, per
// data entry, the pack, offset and length of the sealed chunk. A sealed
// chunk in a pack is byte for byte the object that would be stored at its
// chunk key (the AAD names that key), so it is authenticated as a loose
// one is: a chunk moved, swapped or sealed under another key fails, and
// the reader allocates at most the length the authenticated manifest
// gives (Check bounds it by MaxChunkObject).
//
// A pack is made durable before it is visible (PackWriter.Commit), and
// every pack of a generation before its manifest is written, so a crash
// leaves at most unreferenced packs (GC frees them after its grace) or a
// temp file (dirstore's Sweep). GC keeps a pack while any manifest it
// marks lists it: the unit of garbage is the pack, which is exact for a
// template's generation (every chunk lives as long as it does) and why
// only the template import packs its chunks; a sandbox's generations,
// whose chunks are superseded one by one, keep loose objects.

// PackTarget is the size at which a Writer closes a pack and starts the
// next (a store without Packer holds one in memory while it fills).
const PackTarget = 32 << 20

// packsInFlight bounds the closed packs a Writer commits in the
// background at once (each up to PackTarget of memory without a Packer).
const packsInFlight = 2

func packKey(v Volume, id PackID) string {
	return v.String() + "/packs/" + hex.EncodeToString(id[:])
}

// packState is a packing Writer's. The caller's goroutine records each
// entry by its sum and hands a chunk not queued before to a sealer; the
// sealers append to the current pack in the order they finish, under mu,
// and record where each sum went; Commit places the entries from that
// once every sealer is done. So a chunk is sealed and packed once, and
// the pack's order does not matter (the manifest says where each is).
type packState struct {
	queued  map[[32]byte]bool // the caller's: sums handed to a sealer
	sealers chan struct{}     // a slot per chunk being sealed
	bufs    sync.Pool         // *[]byte copies of the chunks being sealed
	sealing sync.WaitGroup

	mu    sync.Mutex
	ids   []PackID // the packs started so far (an entry's Pack is index+1)
	cur   PackWriter
	size  int64
	at    map[[32]byte]Entry
	slots chan struct{} // a slot per closed pack being committed
}

func newPackState(sealers int) *packState {
	return &packState{
		queued: map[[32]byte]bool{}, sealers: make(chan struct{}, sealers),
		at: map[[32]byte]Entry{}, slots: make(chan struct{}, packsInFlight),
	}
}

// place is e (a data entry) with the pack range its sum was stored at.
func (p *packState) place(e Entry) (Entry, error) {
	at, ok := p.at[e.Sum]
	if !ok {
		return e, fmt.Errorf("chunk %d was never packed", e.Index)
	}
	e.Pack, e.Offset, e.Length = at.Pack, at.Offset, at.Length
	return e, nil
}

// writePacked records chunk i (keyed checksum s) and, unless this
// generation queued the same chunk already, seals a copy of it in the
// background (a sealer slot first) and appends it to the current pack.
func (w *Writer) writePacked(ctx context.Context, i uint64, s [32]byte, data []byte) error {
	w.entries[i] = Entry{Index: i, Kind: EntryData, Sum: s}
	if w.pk.queued[s] {
		return nil
	}
	select {
	case w.pk.sealers <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("commit %s: %w", w.m.Ref(), ctx.Err())
	}
	w.pk.queued[s] = true
	bp, _ := w.pk.bufs.Get().(*[]byte)
	if bp == nil || len(*bp) != len(data) {
		b := make([]byte, len(data))
		bp = &b
	}
	copy(*bp, data)
	w.pk.sealing.Add(1)
	go func() {
		defer func() { w.pk.bufs.Put(bp); <-w.pk.sealers; w.pk.sealing.Done() }()
		if w.firstErr() != nil {
			return // the generation fails already
		}
		blob, err := w.repo.codec.seal(w.dk, kindChunk, chunkKey(w.dk.volume, s), *bp)
		if err == nil {
			err = w.appendPacked(s, blob)
		}
		if err != nil {
			w.setErr(err)
		}
	}()
	return nil
}

// appendPacked appends the sealed chunk of sum s to the current pack
// (closing a full one and opening the next first).
func (w *Writer) appendPacked(s [32]byte, blob []byte) error {
	w.pk.mu.Lock()
	defer w.pk.mu.Unlock()
	if w.pk.cur != nil && w.pk.size+int64(len(blob)) > PackTarget {
		if err := w.closePack(w.ctx); err != nil {
			return err
		}
	}
	if w.pk.cur == nil {
		if err := w.openPack(w.ctx); err != nil {
			return err
		}
	}
	off := w.pk.size
	if _, err := w.pk.cur.Write(blob); err != nil {
		// The pack's tail is unknown now: the generation fails.
		w.pk.cur.Abort()
		w.pk.cur = nil
		return fmt.Errorf("write pack: %w", err)
	}
	w.pk.size += int64(len(blob))
	w.pk.at[s] = Entry{Kind: EntryData, Sum: s, Pack: uint32(len(w.pk.ids)), Offset: uint32(off), Length: uint32(len(blob))}
	return nil
}

// openPack starts the next pack (pk.mu held, or no sealer running).
func (w *Writer) openPack(ctx context.Context) error {
	var id PackID
	if _, err := rand.Read(id[:]); err != nil {
		return fmt.Errorf("commit %s: pack id: %w", w.m.Ref(), err)
	}
	key := packKey(w.m.Volume, id)
	var pw PackWriter = &memPack{store: w.repo.store, key: key}
	if p, ok := w.repo.store.(Packer); ok {
		var err error
		if pw, err = p.NewPack(ctx, key); err != nil {
			return fmt.Errorf("commit %s: %w", w.m.Ref(), err)
		}
	}
	w.pk.ids = append(w.pk.ids, id)
	w.pk.cur, w.pk.size = pw, 0
	return nil
}

// closePack commits the current pack in the background (a slot of
// packsInFlight first; pk.mu held, or no sealer running); Commit waits
// for it before the manifest.
func (w *Writer) closePack(ctx context.Context) error {
	select {
	case w.pk.slots <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("commit %s: %w", w.m.Ref(), ctx.Err())
	}
	pw := w.pk.cur
	w.pk.cur, w.pk.size = nil, 0
	w.wg.Add(1)
	go func() {
		defer func() { <-w.pk.slots; w.wg.Done() }()
		if err := pw.Commit(w.ctx); err != nil {
			w.setErr(fmt.Errorf("commit pack: %w", err))
		}
	}()
	return nil
}

func (w *Writer) setErr(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.mu.Unlock()
}

// memPack is a pack for a store without Packer: built in memory, one Put.
type memPack struct {
	store Store
	key   string
	b     []byte
}

func (p *memPack) Write(b []byte) (int, error) {
	if int64(len(p.b))+int64(len(b)) > MaxPackObject {
		return 0, fmt.Errorf("pack %s: over %d bytes", p.key, MaxPackObject)
	}
	p.b = append(p.b, b...)
	return len(b), nil
}

func (p *memPack) Commit(ctx context.Context) error {
	b := p.b
	p.b = nil
	return p.store.Put(ctx, p.key, b)
}

func (p *memPack) Abort() { p.b = nil }
