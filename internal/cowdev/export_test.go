package cowdev

// Fetches is the number of chunk fetches from the store so far.
func (d *Device) Fetches() uint64 {
	d.stateMu.RLock()
	defer d.stateMu.RUnlock()
	return d.fetches
}

// Cached says chunk i is in the chunk cache.
func (d *Device) Cached(i int64) bool {
	mu := d.lock(i)
	mu.RLock()
	defer mu.RUnlock()
	return d.cached[i]
}

// Prefetched says chunk i is in the prefetch ring.
func (d *Device) Prefetched(i int64) bool {
	mu := d.lock(i)
	mu.RLock()
	defer mu.RUnlock()
	return d.isPrefetched(i)
}

// PrefetchedCount is the number of chunks in the prefetch ring.
func (d *Device) PrefetchedCount() int {
	d.preMu.Lock()
	defer d.preMu.Unlock()
	n := 0
	for _, s := range d.pre {
		if s.bp != nil {
			n++
		}
	}
	return n
}

// SetSealHook makes every later Seal call fn after each chunk it uploads
// (in the seal's goroutine, with no lock held).
func (d *Device) SetSealHook(fn func(i uint64)) { d.sealHook = fn }
