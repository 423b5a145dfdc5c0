package wire

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"testing"
)

func TestFrameRoundTripAndLimits(t *testing.T) {
	var b bytes.Buffer
	if err := WriteFrame(&b, TStdout, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	typ, p, err := ReadFrame(&b, nil, 0)
	if err != nil || typ != TStdout || string(p) != "hello" {
		t.Fatalf("got %q %q %v", typ, p, err)
	}
	if err := WriteFrame(&b, TData, make([]byte, MaxPayload+1)); !errors.Is(err, ErrFrame) {
		t.Fatalf("oversized write: %v", err)
	}
	WriteFrame(&b, TData, make([]byte, 100))
	if _, _, err := ReadFrame(&b, nil, 99); !errors.Is(err, ErrFrame) {
		t.Fatalf("frame over the reader's max: %v", err)
	}
}

// TestWriteFrameBuffered: frames written through a bufio.Writer, written
// one write each, and laid out with PutHeader are the same bytes.
func TestWriteFrameBuffered(t *testing.T) {
	payloads := [][]byte{nil, []byte("x"), bytes.Repeat([]byte("y"), MaxPayload), bytes.Repeat([]byte("z"), 3000)}
	var plain, buffered, laid bytes.Buffer
	bw := bufio.NewWriterSize(&buffered, 4096)
	for _, p := range payloads {
		if err := WriteFrame(&plain, TData, p); err != nil {
			t.Fatal(err)
		}
		if err := WriteFrame(bw, TData, p); err != nil {
			t.Fatal(err)
		}
		h := make([]byte, HeaderLen)
		PutHeader(h, TData, len(p))
		laid.Write(append(h, p...))
	}
	if err := bw.Flush(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(plain.Bytes(), buffered.Bytes()) || !bytes.Equal(plain.Bytes(), laid.Bytes()) {
		t.Fatalf("plain %d bytes, buffered %d, laid out %d: not the same", plain.Len(), buffered.Len(), laid.Len())
	}
	br := bufio.NewReader(&plain)
	for i, want := range payloads {
		typ, p, err := ReadFrame(br, nil, 0)
		if err != nil || typ != TData || !bytes.Equal(p, want) {
			t.Fatalf("frame %d: %q, %d bytes, %v", i, typ, len(p), err)
		}
	}
	if _, _, err := ReadFrame(br, nil, 0); err != io.EOF {
		t.Fatalf("after the last frame: %v, want EOF", err)
	}
}

func TestDecodeStrict(t *testing.T) {
	var r Ready
	for _, s := range []string{`{"nonce":"a","x":1}`, `{"nonce":"a"} {}`, `{"nonce":1}`, ``, `{"nonce":"a"}x`} {
		if err := Decode([]byte(s), &r); err == nil {
			t.Errorf("Decode(%q) accepted", s)
		}
	}
	if err := Decode([]byte(` {"nonce":"a"} `), &r); err != nil || r.Nonce != "a" {
		t.Fatalf("valid: %v %+v", err, r)
	}
}

func FuzzReadFrame(f *testing.F) {
	var b bytes.Buffer
	WriteFrame(&b, TResult, []byte(`{"nonce":"x"}`))
	f.Add(b.Bytes())
	f.Add([]byte{'r', 0xff, 0xff, 0xff, 0xff})
	f.Add(append(bytes.Clone(b.Bytes()), 'd', 0, 0, 0, 9, 'x'))
	f.Add([]byte{'d', 0, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		// NextFrame on the same bytes agrees frame by frame and error by
		// error.
		br := bufio.NewReaderSize(bytes.NewReader(in), HeaderLen+1024)
		for {
			typ, p, err := ReadFrame(r, nil, 1024)
			btyp, bp, berr := NextFrame(br, 1024)
			if typ != btyp || !bytes.Equal(p, bp) || (err == nil) != (berr == nil) || errors.Is(err, ErrFrame) != errors.Is(berr, ErrFrame) || errors.Is(err, io.EOF) != errors.Is(berr, io.EOF) {
				t.Fatalf("ReadFrame %q %q %v, NextFrame %q %q %v", typ, p, err, btyp, bp, berr)
			}
			if err != nil {
				return
			}
			if len(p) > 1024 {
				t.Fatalf("frame of %d bytes over the max", len(p))
			}
			var v Request
			Decode(p, &v)
		}
	})
}
