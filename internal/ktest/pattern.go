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
}

// fill puts the pattern's bytes at offset off into b: one copy of the
// base block and the stamp.
func fill(b []byte, off int64) {
	for len(b) > 0 {
		n := copy(b, block(off))
		b, off = b[n:], off+int64(n)
	}
}

// block is the pattern from off to the end of off's block, but for the
// stamp, which stamp adds.
func block(off int64) []byte {
	k, in := off/patternBlock, off%patternBlock
	return patternBase[(k%16)*patternBlock+in : (k%16+1)*patternBlock]
}

// stamp overwrites the stamps of the blocks b (at offset off) holds.
func stamp(b []byte, off int64) {
	var st [8]byte
	for k := off / patternBlock; k*patternBlock < off+int64(len(b)); k++ {
		binary.BigEndian.PutUint64(st[:], uint64(k*patternBlock))
		for i := range st {
			if o := k*patternBlock + int64(i) - off; o >= 0 && o < int64(len(b)) {
				b[o] = st[i]
			}
		}
	}
}

// Read implements io.Reader: the next bytes of the stream, io.EOF after N.
func (p *Pattern) Read(b []byte) (int, error) {
	if p.off >= p.N {
		return 0, io.EOF
	}
	b = b[:min(int64(len(b)), p.N-p.off)]
	fill(b, p.off)
	stamp(b, p.off)
	p.off += int64(len(b))
	return len(b), nil
}

// ReadAt implements io.ReaderAt.
func (p *Pattern) ReadAt(b []byte, off int64) (int, error) {
	if off >= p.N {
		return 0, io.EOF
	}
	n := int(min(int64(len(b)), p.N-off))
	fill(b[:n], off)
	stamp(b[:n], off)
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
}

// Write implements io.Writer: b is compared with the base blocks in
// place, and the stamps apart (no copy of the pattern is made).
func (c *PatternCheck) Write(b []byte) (int, error) {
	if c.off+int64(len(b)) > c.N {
		return 0, fmt.Errorf("pattern: %d bytes past its %d", c.off+int64(len(b))-c.N, c.N)
	}
	var st [8]byte
	for i := 0; i < len(b); {
		off := c.off + int64(i)
		want := block(off)
		n := min(len(b)-i, len(want))
		got, want := b[i:i+n], want[:n]
		if in := off % patternBlock; in < 8 {
			// The stamp's bytes in this piece.
			binary.BigEndian.PutUint64(st[:], uint64(off-in))
			k := min(int(8-in), len(got))
			if !bytes.Equal(got[:k], st[in:int(in)+k]) {
				return i, fmt.Errorf("pattern: the stamp at byte %d differs", off)
			}
			got, want = got[k:], want[k:]
		}
		if !bytes.Equal(got, want) {
			return i, fmt.Errorf("pattern: bytes %d to %d differ", off, off+int64(len(got)))
		}
		i += n
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
