package ktest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
)

// patternBlock is the unit of a Pattern: each block is one of 16 fixed
// pseudo-random blocks with its own offset stamped in its first 8 bytes,
// so a block out of place, lost or repeated is caught.
const patternBlock = 4 << 10

var patternBase = func() []byte {
	b := make([]byte, 16*patternBlock)
	x := uint64(0x9e3779b97f4a7c15)
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
	return b
}()

// Pattern is a reproducible stream of N bytes for moving large files
// through a slow machine: it costs a copy per byte (a hash of the stream
// would cost the TCG test VM more than what it measures), and Check
// compares a stream with it the same way.
type Pattern struct {
	N   int64
	off int64
	blk [patternBlock]byte
}

// fill puts the pattern's bytes at offset off into b.
func (p *Pattern) fill(b []byte, off int64) {
	for len(b) > 0 {
		k, in := off/patternBlock, int(off%patternBlock)
		copy(p.blk[:], patternBase[(k%16)*patternBlock:])
		binary.BigEndian.PutUint64(p.blk[:8], uint64(k*patternBlock))
		n := copy(b, p.blk[in:])
		b, off = b[n:], off+int64(n)
	}
}

// Read implements io.Reader: the next bytes of the stream, io.EOF after N.
func (p *Pattern) Read(b []byte) (int, error) {
	if p.off >= p.N {
		return 0, io.EOF
	}
	b = b[:min(int64(len(b)), p.N-p.off)]
	p.fill(b, p.off)
	p.off += int64(len(b))
	return len(b), nil
}

// ReadAt implements io.ReaderAt (not concurrently with itself or Read).
func (p *Pattern) ReadAt(b []byte, off int64) (int, error) {
	if off >= p.N {
		return 0, io.EOF
	}
	n := int(min(int64(len(b)), p.N-off))
	p.fill(b[:n], off)
	if n < len(b) {
		return n, io.EOF
	}
	return n, nil
}

// PatternCheck is an io.Writer that compares what is written to it with
// Pattern{N: N}: the first difference, or a stream past N, fails the
// Write; Err after the end says whether it was all of it.
type PatternCheck struct {
	N   int64
	off int64
	p   Pattern
	exp []byte
}

// Write implements io.Writer.
func (c *PatternCheck) Write(b []byte) (int, error) {
	if c.off+int64(len(b)) > c.N {
		return 0, fmt.Errorf("pattern: %d bytes past its %d", c.off+int64(len(b))-c.N, c.N)
	}
	if cap(c.exp) < len(b) {
		c.exp = make([]byte, len(b))
	}
	exp := c.exp[:len(b)]
	c.p.fill(exp, c.off)
	if !bytes.Equal(b, exp) {
		i := 0
		for b[i] == exp[i] {
			i++
		}
		return i, fmt.Errorf("pattern: byte %d differs", c.off+int64(i))
	}
	c.off += int64(len(b))
	return len(b), nil
}

// Err says whether exactly N bytes arrived.
func (c *PatternCheck) Err() error {
	if c.off != c.N {
		return fmt.Errorf("pattern: %d of %d bytes", c.off, c.N)
	}
	return nil
}
