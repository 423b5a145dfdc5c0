// Package cleanup rolls back partial construction, after gVisor's
// pkg/cleanup: a constructor that makes several things Adds the undo of
// each as it makes it, defers Clean, and Releases on success, so an early
// return undoes exactly what was made, newest first, with no hand-ordered
// rollback at each exit.
//
//	var cu cleanup.Cleanup
//	defer cu.Clean()
//	f, err := os.Open(p)
//	if err != nil {
//		return nil, err
//	}
//	cu.Add(func() { _ = f.Close() })
//	...
//	cu.Release()
//	return v, nil
package cleanup

// Cleanup holds undo functions. Its zero value is ready to use; it is not
// safe for concurrent use (one constructor owns it).
type Cleanup struct {
	fns []func()
}

// Make returns a Cleanup holding f.
func Make(f func()) Cleanup {
	return Cleanup{fns: []func(){f}}
}

// Add adds f to run on Clean, before everything added earlier. A nil f
// is ignored.
func (c *Cleanup) Add(f func()) {
	if f != nil {
		c.fns = append(c.fns, f)
	}
}

// Clean runs the functions added, newest first, and forgets them: a
// second Clean, or a Clean after Release, does nothing.
func (c *Cleanup) Clean() {
	fns := c.fns
	c.fns = nil
	for i := len(fns) - 1; i >= 0; i-- {
		fns[i]()
	}
}

// Release forgets the functions without running them (construction
// succeeded: what was made now belongs to the result) and returns one
// function that runs them as Clean would, for a caller that keeps the
// undo for later (for example a Close that unwinds a constructor).
func (c *Cleanup) Release() func() {
	r := Cleanup{fns: c.fns}
	c.fns = nil
	return r.Clean
}
