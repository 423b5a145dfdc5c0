package cowdev

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/ctld/ctld/internal/blockstore"
)

// SealStats is what one Seal did.
type SealStats struct {
	// Ref is the generation committed, Parent the base it was sealed over.
	Ref, Parent blockstore.GenRef
	// DataChunks and ZeroChunks are the chunks written to it (a data
	// chunk of zeros is stored as a hole too); Bytes is the data chunks'
	// size before compression.
	DataChunks, ZeroChunks int
	Bytes                  int64
	// Barrier is how long writes were held (the state copy); Took the
	// whole seal.
	Barrier, Took time.Duration
}

// sealRun is a seal in flight. flags[i] belongs to chunk i and is read
// and changed only under chunk i's lock.
type sealRun struct {
	flags []uint8
	side  *os.File // Dir/seal: chunks saved before a write changed them
	mu    sync.Mutex
	err   error // a failed save: the seal cannot hold its snapshot
}

// Bits of sealRun.flags.
const (
	fState   = 0x03 // the chunk's state when the seal began: stData, stZero, or 0 (not sealed)
	fPending = 0x04 // not read for upload yet
	fSaved   = 0x08 // side holds its bytes from when the seal began
	fTouched = 0x10 // written, trimmed or zeroed since the seal began
)

func (sr *sealRun) fail(err error) {
	sr.mu.Lock()
	if sr.err == nil {
		sr.err = err
	}
	sr.mu.Unlock()
}

func (sr *sealRun) failed() error {
	sr.mu.Lock()
	defer sr.mu.Unlock()
	return sr.err
}

// beforeWrite runs under chunk i's write lock before a write, trim or
// zeroing of it changes anything. During a seal, a sealed chunk not yet
// uploaded is first copied to the side file (copy on write: the seal
// uploads the bytes it had when the seal began), and every sealed chunk
// written is marked, so the rebase keeps it dirty. A failed copy fails
// the seal, never the write.
func (d *Device) beforeWrite(i int64) {
	sr := d.sealing.Load()
	if sr == nil {
		return
	}
	f := sr.flags[i]
	if f&fState == 0 {
		return
	}
	if f&fState == stData && f&(fPending|fSaved) == fPending {
		if err := d.saveForSeal(sr, i); err != nil {
			sr.fail(err)
		} else {
			f |= fSaved
		}
	}
	sr.flags[i] = f | fTouched
}

func (d *Device) saveForSeal(sr *sealRun, i int64) error {
	bp := d.chunkBuf()
	defer d.bufs.Put(bp)
	if err := readFull(d.dirty, *bp, i*d.cs); err != nil {
		return err
	}
	if _, err := sr.side.WriteAt(*bp, i*d.cs); err != nil {
		return fmt.Errorf("cowdev: save chunk %d for the seal: %w", i, err)
	}
	return nil
}

// Seal commits the device as generation ref over its base, then rebases
// the device onto it. The device serves throughout.
//
//  1. The write barrier: new writes, trims and zeroings wait, those in
//     flight finish; the dirty set is copied (the snapshot: which chunks
//     are data or zero) and the barrier is let go. Writes wait for that
//     copy only: a walk of the dirty set in memory, so the barrier grows
//     with the dirty chunk count (microseconds per thousand), not with
//     the device's size, and not with the upload.
//  2. Sync: the dirty file and the index, with every snapshot chunk dirty
//     in it, are made durable (see openIndex for why that matters).
//  3. Upload: each snapshot chunk as it was at the barrier (a write that
//     reaches a chunk not yet uploaded saves its old bytes to Dir/seal
//     first: beforeWrite), then Commit, whose manifest is the last
//     object: a crash or error before it leaves no generation.
//  4. Rebase: the base becomes ref (its image built from the old one and
//     the manifest, no store read); a snapshot chunk not written since
//     the barrier becomes clean (a zeroed one) or clean with its copy in
//     the dirty file (stLocal: the next seal does not upload it again);
//     the index is replaced with the new base.
//
// On an error before the commit nothing changed. An error of the commit
// itself may hide a manifest that was stored (a lost answer): the caller
// must not reuse ref, and a re-open over either base is correct (see
// openIndex). One seal at a time.
func (d *Device) Seal(ctx context.Context, ref blockstore.GenRef) (SealStats, error) {
	d.sealMu.Lock()
	defer d.sealMu.Unlock()
	// The shared cache holds the old base's chunks, and the rebase below
	// turns chunks clean that the new base holds: from here on the store
	// (or the device's own cache) serves the base.
	d.shared.Store(nil)
	start := time.Now()
	parent := d.Base()
	st := SealStats{Ref: ref, Parent: parent}
	fail := func(err error) (SealStats, error) {
		return st, fmt.Errorf("cowdev: seal %s over %s: %w", ref, parent, err)
	}
	// Before the barrier: the store round trips (the manifest must not
	// exist, the volume's key) and the side file.
	w, err := d.cfg.Repo.NewWriter(ctx, blockstore.CommitSpec{
		Generation: ref, Parent: &parent, DeviceSize: uint64(d.size), ChunkSize: uint32(d.cs),
	})
	if err != nil {
		return fail(err)
	}
	committed := false
	defer func() {
		if !committed {
			w.Abort()
		}
	}()
	sidePath := filepath.Join(d.cfg.Dir, sealName)
	side, err := openSized(sidePath, d.size, true)
	if err != nil {
		return fail(err)
	}
	defer func() { _ = side.Close(); _ = os.Remove(sidePath) }()
	sr := &sealRun{flags: make([]uint8, len(d.state)), side: side}
	// Fault its pages in now, not under the barrier (one page per 4096
	// chunks: a 16 GiB device's scattered dirty chunks cost a fault each
	// there otherwise).
	for i := 0; i < len(sr.flags); i += 4096 {
		sr.flags[i] = 0
	}

	// The barrier covers a walk of the dirty set only, not of every
	// chunk's state.
	b0 := time.Now()
	d.wbar.Lock()
	d.stateMu.RLock()
	list := make([]int64, 0, len(d.dirtySet))
	for i := range d.dirtySet {
		sr.flags[i] = d.state[i] | fPending
		list = append(list, i)
	}
	d.stateMu.RUnlock()
	d.sealing.Store(sr)
	d.wbar.Unlock()
	st.Barrier = time.Since(b0)
	slices.Sort(list) // uploaded in device order
	defer d.sealing.Store(nil)

	if err := d.Sync(); err != nil {
		return fail(err)
	}
	buf := make([]byte, d.cs)
	for _, i := range list {
		mu := d.lock(i)
		mu.Lock()
		f := sr.flags[i]
		var data []byte
		if f&fState == stData {
			src := d.dirty
			if f&fSaved != 0 {
				src = side
			}
			err = readFull(src, buf, i*d.cs)
			data = buf
		}
		sr.flags[i] = f &^ fPending
		mu.Unlock()
		if err == nil {
			// Checked after the read: a failed save of this chunk
			// was recorded before its write changed the dirty file.
			err = sr.failed()
		}
		if err != nil {
			return fail(err)
		}
		// The chunk is sealed (encrypted) before WriteChunk returns, so
		// buf is free again.
		if err := w.WriteChunk(ctx, uint64(i), data); err != nil {
			return fail(err)
		}
		if data != nil {
			st.DataChunks++
			st.Bytes += d.cs
		} else {
			st.ZeroChunks++
		}
		if d.sealHook != nil {
			d.sealHook(uint64(i))
		}
	}
	committed = true
	m, err := w.Commit(ctx)
	if err != nil {
		return fail(err)
	}
	if err := d.rebase(m, sr, list); err != nil {
		// The generation stands; the device still serves over the old
		// base, its contents unchanged.
		return fail(fmt.Errorf("committed, but not rebased: %w", err))
	}
	st.Took = time.Since(start)
	d.log.Info("sealed", "generation", ref.String(), "parent", parent.String(),
		"data_chunks", st.DataChunks, "zero_chunks", st.ZeroChunks,
		"barrier", st.Barrier, "took", st.Took.Round(time.Microsecond))
	return st, nil
}

// rebase makes m (committed over the base, from the snapshot list) the
// device's base; see Seal.
func (d *Device) rebase(m *blockstore.Manifest, sr *sealRun, list []int64) error {
	child, err := d.img().Child(m)
	if err != nil {
		return err
	}
	d.syncMu.Lock()
	defer d.syncMu.Unlock()
	// The image first: until its state changes below, a snapshot chunk
	// is data or zero and reads no image; every other clean chunk reads
	// the same in both.
	d.stateMu.Lock()
	d.im.Store(child)
	d.baseRef = m.Ref()
	d.version++ // the index names the base
	d.stateMu.Unlock()
	for _, i := range list {
		mu := d.lock(i)
		mu.Lock()
		if f := sr.flags[i]; f&fTouched == 0 {
			if f&fState == stData {
				d.setState(i, stLocal)
			} else {
				d.setState(i, stClean) // a hole in the new base
			}
			d.cached[i] = false // the old base's bytes
		}
		mu.Unlock()
	}
	d.sealing.Store(nil)
	if err := d.syncLocked(); err != nil {
		// Rebased in memory; the next Sync writes the index again, and
		// until then the old index re-opens correctly over either base.
		d.log.Warn("sync after the rebase", "generation", m.Ref().String(), "err", err)
	}
	return nil
}
