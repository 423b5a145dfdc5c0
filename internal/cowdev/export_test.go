package cowdev

// Fetches is the number of chunk fetches from the store so far.
func (d *Device) Fetches() uint64 {
	d.stateMu.RLock()
	defer d.stateMu.RUnlock()
	return d.fetches
}
