package guestlog

import (
	"io"
	"sync"
)

// CappedFile is the writer of a process's own log file that it appends to
// with O_APPEND (W; its stderr may share the file): after every Max/4
// bytes written it bounds the file with Cap, so the file and its old half
// hold at most about 1.25 * Max bytes each, whatever the process is made
// to log. A failed Cap is not a failed write (the line is written).
type CappedFile struct {
	W    io.Writer
	Path string
	Max  int64

	mu    sync.Mutex
	since int64
}

// Write writes p to W, then caps the file if due.
func (c *CappedFile) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, err := c.W.Write(p)
	c.since += int64(n)
	if c.since >= max(c.Max/4, 1) {
		c.since = 0
		_ = Cap(c.Path, c.Max)
	}
	return n, err
}
