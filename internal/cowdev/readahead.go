package cowdev

import (
	"context"
	"runtime"
)

// Readahead: a read that starts where a recent read ended is sequential,
// and the chunks after it that would need a store fetch are queued for a
// few prefetch workers, which fetch, authenticate, decode and cache them
// as a read would (under the chunk's lock, so still one fetch per chunk).
// A sequential reader then finds its next chunks cached, or being
// fetched, instead of fetching each in turn: with a local store the decode
// runs on another core while the last chunk is served; with a remote
// store the fetch latency overlaps too.
//
// Bounds: at most Config.Readahead chunks are queued (a full queue drops
// the rest: a read never waits for readahead) and at most one window
// (Config.Readahead chunks past the read) per stream is queued; each
// worker holds one chunk buffer while it fetches. Prefetched chunks live in
// the cache file like any fetched chunk. A prefetch that fails (a store
// error, a tampered object) caches nothing: the read that needs the chunk
// fetches it itself and gets the error. Close stops the workers and waits
// for them.

// defaultReadahead is Config.Readahead's default (chunks).
const defaultReadahead = 16

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

// prefetch fetches chunk i into the cache if it still needs it. It skips a
// chunk whose lock is taken: its reader or writer is on it already.
func (d *Device) prefetch(ctx context.Context, i int64) {
	mu := d.lock(i)
	if !mu.TryLock() {
		return
	}
	defer mu.Unlock()
	if d.state[i] != stClean || d.cached[i] || d.im.IsZero(uint64(i)) {
		return
	}
	bp := d.chunkBuf()
	defer d.bufs.Put(bp)
	// An error is logged by baseCtx and otherwise dropped: the chunk
	// stays uncached, so the read that needs it fetches it and fails.
	_ = d.baseCtx(ctx, i, *bp)
}
