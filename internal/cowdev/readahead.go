package cowdev

import (
	"context"
	"runtime"
)

// Readahead: a read that starts where a recent read ended is sequential,
// and the chunks after it that would need a store fetch are queued for a
// few prefetch workers, which fetch, authenticate and decode them as a
// read would (under the chunk's lock, so still one fetch per chunk). A
// sequential reader then finds its next chunks ready, or being fetched,
// instead of fetching each in turn: with a local store the decode runs on
// another core while the last chunk is served; with a remote store the
// fetch latency overlaps too.
//
// Where a prefetched chunk waits for its read: with a remote store in the
// cache, like any fetched chunk; with a local store, whose whole-chunk
// reads are not cached (Config.LocalStore), in the prefetch ring, a few
// chunk buffers in memory (reused: no fresh pages) that the read takes
// its chunk from.
//
// Bounds: at most Config.Readahead chunks are queued (a full queue drops
// the rest: a read never waits for readahead) and at most one window
// (Config.Readahead chunks past the read) per stream is queued; each
// worker holds one chunk buffer while it fetches; the ring holds preRing
// windows and drops its oldest unread chunk for a new one, and a write
// or zeroing of a chunk drops its copy. A prefetch that fails (a store
// error, a tampered object) keeps nothing: the read that needs the chunk
// fetches it itself and gets the error. Close stops the workers and waits
// for them.

// defaultReadahead is Config.Readahead's default (chunks).
const defaultReadahead = 16

// preRing is the prefetch ring's size in windows (Config.Readahead
// chunks each): room for the window ahead of a reader and the one it is
// reading, beyond which the oldest unread chunk is dropped.
const preRing = 2

// raStreams is how many sequential readers are followed at once (nbdcopy
// reads over several connections, each sequential).
const raStreams = 8

// raStream is one followed reader.
type raStream struct {
	end    int64 // where its last read ended
	queued int64 // the last chunk queued for it, -1 for none
}

func (d *Device) startReadahead(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	d.raStop = cancel
	d.raq = make(chan int64, d.cfg.Readahead)
	for k := range d.streams {
		d.streams[k] = raStream{end: -1, queued: -1}
	}
	// A local fetch is CPU: one worker per core. A remote one is latency:
	// as many as a read fetches concurrently.
	workers := fetchParallel
	if d.cfg.LocalStore {
		workers = runtime.GOMAXPROCS(0)
		d.pre = make([]preSlot, preRing*d.cfg.Readahead)
	}
	workers = min(workers, d.cfg.Readahead)
	for range workers {
		d.raWG.Add(1)
		go func() {
			defer d.raWG.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case i := <-d.raq:
					d.prefetch(ctx, i)
				}
			}
		}()
	}
}

// readahead notes a read of [off, off+n) and, if it is sequential, queues
// the chunks of its window that need a fetch.
func (d *Device) readahead(off, n int64) {
	end := off + n
	if d.raq == nil || n <= 0 || off < 0 || end > d.size {
		return // out of range: ReadAt refuses it
	}
	last := (end - 1) / d.cs
	d.raMu.Lock()
	k := -1
	// A read at offset 0 starts a stream in an unused slot: a whole-device
	// reader starts there.
	for j := range d.streams {
		if d.streams[j].end == off || (off == 0 && d.streams[j].end == -1) {
			k = j
			break
		}
	}
	if k < 0 {
		// A new stream replaces the oldest; nothing to queue yet.
		d.streams[d.raNext] = raStream{end: end, queued: last}
		d.raNext = (d.raNext + 1) % raStreams
		d.raMu.Unlock()
		return
	}
	s := &d.streams[k]
	from := max(s.queued, last) + 1
	to := min(last+int64(d.cfg.Readahead), int64(len(d.state))-1)
	s.end = end
	s.queued = max(s.queued, to)
	d.raMu.Unlock()
	for i := from; i <= to; i++ {
		if !d.needsFetch(i) {
			continue
		}
		select {
		case d.raq <- i:
		default:
			return // full: the window is dropped, not waited for
		}
	}
}

// prefetch fetches chunk i ahead of its reader if it still needs it: into
// the cache (a remote store), or into the prefetch ring (a local store,
// whose whole-chunk reads are not cached: see Config.LocalStore). It skips
// a chunk whose lock is taken: its reader or writer is on it already.
func (d *Device) prefetch(ctx context.Context, i int64) {
	mu := d.lock(i)
	if !mu.TryLock() {
		return
	}
	defer mu.Unlock()
	if d.state[i] != stClean || d.cached[i] || d.img().IsZero(uint64(i)) || d.isPrefetched(i) || d.sharedHas(i) {
		return
	}
	bp := d.chunkBuf()
	// An error is logged by fetch and otherwise dropped: the chunk stays
	// neither cached nor prefetched, so the read that needs it fetches it
	// and fails.
	if d.pre == nil {
		_ = d.load(ctx, i, *bp, true)
		d.bufs.Put(bp)
		return
	}
	if err := d.fetch(ctx, i, *bp); err != nil {
		d.bufs.Put(bp)
		return
	}
	if g := d.shared.Load(); g != nil {
		g.Put(i, *bp)
	}
	d.putPrefetched(i, bp)
}

// preSlot is one slot of the prefetch ring: chunk i's base, verified and
// decoded, in a buffer of the device's pool (nil: empty).
type preSlot struct {
	i  int64
	bp *[]byte
}

// putPrefetched keeps bp as chunk i's base, in place of the oldest slot.
// The caller holds chunk i's lock.
func (d *Device) putPrefetched(i int64, bp *[]byte) {
	d.preMu.Lock()
	s := &d.pre[d.preNext]
	old := s.bp
	*s = preSlot{i: i, bp: bp}
	d.preNext = (d.preNext + 1) % len(d.pre)
	d.preMu.Unlock()
	if old != nil {
		d.bufs.Put(old) // evicted unread: its reader went elsewhere
	}
}

// takePrefetched removes and returns chunk i's prefetched base, or nil.
// The caller holds chunk i's lock (so the slot cannot change under it),
// and owns the buffer: it returns it to d.bufs.
func (d *Device) takePrefetched(i int64) *[]byte {
	if d.pre == nil {
		return nil
	}
	d.preMu.Lock()
	defer d.preMu.Unlock()
	for k := range d.pre {
		if s := &d.pre[k]; s.bp != nil && s.i == i {
			bp := s.bp
			s.bp = nil
			return bp
		}
	}
	return nil
}

// isPrefetched says chunk i is in the prefetch ring.
func (d *Device) isPrefetched(i int64) bool {
	if d.pre == nil {
		return false
	}
	d.preMu.Lock()
	defer d.preMu.Unlock()
	for _, s := range d.pre {
		if s.bp != nil && s.i == i {
			return true
		}
	}
	return false
}
