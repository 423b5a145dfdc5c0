package blockstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
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

// packState is a packing Writer's: the packs started so far (their
// indexes +1 are the entries' Pack), the one being filled, and where each
// chunk of this generation went (a chunk is packed once).
type packState struct {
	ids   []PackID
	cur   PackWriter
	size  int64
	at    map[[32]byte]Entry
	slots chan struct{}
}

func newPackState() *packState {
	return &packState{at: map[[32]byte]Entry{}, slots: make(chan struct{}, packsInFlight)}
}

// writePacked seals chunk i (keyed checksum s) and appends it to the
// current pack, unless this generation packed the same chunk already.
func (w *Writer) writePacked(ctx context.Context, i uint64, s [32]byte, data []byte) error {
	ref := w.m.Ref()
	if e, ok := w.pk.at[s]; ok {
		e.Index = i
		w.entries[i] = e
		return nil
	}
	blob, err := w.repo.codec.seal(w.dk, kindChunk, chunkKey(w.dk.volume, s), data)
	if err != nil {
		return fmt.Errorf("commit %s: %w", ref, err)
	}
	if w.pk.cur != nil && w.pk.size+int64(len(blob)) > PackTarget {
		if err := w.closePack(ctx); err != nil {
			return err
		}
	}
	if w.pk.cur == nil {
		if err := w.openPack(ctx); err != nil {
			return err
		}
	}
	off := w.pk.size
	if _, err := w.pk.cur.Write(blob); err != nil {
		// The pack's tail is unknown now: the generation fails.
		w.pk.cur.Abort()
		w.pk.cur = nil
		w.setErr(fmt.Errorf("write pack: %w", err))
		return fmt.Errorf("commit %s: write pack: %w", ref, err)
	}
	w.pk.size += int64(len(blob))
	e := Entry{Index: i, Kind: EntryData, Sum: s, Pack: uint32(len(w.pk.ids)), Offset: uint32(off), Length: uint32(len(blob))}
	w.pk.at[s] = e
	w.entries[i] = e
	return nil
}

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
// packsInFlight first); Commit waits for it before the manifest.
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
