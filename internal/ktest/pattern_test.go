package ktest

import (
	"bytes"
	"io"
	"testing"
)

// TestPatternCheck: a stream read from Pattern in odd pieces passes its
// check; a changed byte, a block moved elsewhere, a short or long stream
// do not.
func TestPatternCheck(t *testing.T) {
	const n = 3*patternBlock*16 + 123
	var all bytes.Buffer
	if _, err := io.CopyBuffer(&all, &Pattern{N: n}, make([]byte, 777)); err != nil || all.Len() != n {
		t.Fatalf("read pattern: %d bytes, %v", all.Len(), err)
	}
	check := func(b []byte) error {
		for _, piece := range []int{1, 1000, 4093, n} {
			c := &PatternCheck{N: n}
			for b := b; len(b) > 0; {
				k := min(len(b), piece)
				if _, err := c.Write(b[:k]); err != nil {
					return err
				}
				b = b[k:]
			}
			if err := c.Err(); err != nil {
				return err
			}
		}
		return nil
	}
	good := all.Bytes()
	at := make([]byte, 5000)
	if k, err := (&Pattern{N: n}).ReadAt(at, n-4000); k != 4000 || err != io.EOF || !bytes.Equal(at[:k], good[n-4000:]) {
		t.Errorf("ReadAt the last 4000 bytes: %d, %v, equal %v", k, err, bytes.Equal(at[:k], good[n-4000:]))
	}
	if err := check(good); err != nil {
		t.Fatalf("the pattern itself: %v", err)
	}
	flipped := bytes.Clone(good)
	flipped[n/2] ^= 1
	// A block from 16 blocks later: the same pseudo-random bytes, another
	// stamp.
	moved := bytes.Clone(good)
	copy(moved[patternBlock:2*patternBlock], good[17*patternBlock:])
	stamped := bytes.Clone(good)
	stamped[5*patternBlock+7] ^= 1
	for name, b := range map[string][]byte{"flipped": flipped, "moved": moved, "stamp": stamped, "short": good[:n-1], "long": append(bytes.Clone(good), 0)} {
		if check(b) == nil {
			t.Errorf("%s stream passed the check", name)
		}
	}
}
