package blockstore

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/klauspost/compress/s2"
)

func testKey(t testing.TB, vol Volume) *DataKey {
	t.Helper()
	secret := make([]byte, KeySize)
	if _, err := rand.Read(secret); err != nil {
		t.Fatal(err)
	}
	dk, err := newDataKey("dk-test", vol, secret)
	if err != nil {
		t.Fatal(err)
	}
	return dk
}

func testCodec(t testing.TB, compress Compression) *codec {
	t.Helper()
	c, err := newCodec(compress)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// compressions are the settings a codec takes.
var compressions = []Compression{CompressNone, CompressS2, CompressZstd}

// objFlags is the flags byte of a sealed object's header.
func objFlags(blob []byte) uint8 { return blob[len(objMagic)+2] }

// Each setting round-trips random, compressible and empty payloads, and
// compresses with what it names: S2 for chunks and zstd for the other
// kinds under CompressS2, zstd for every kind under CompressZstd, nothing
// under CompressNone (the flags say which).
func TestSealOpenRoundTrip(t *testing.T) {
	dk := testKey(t, Sandbox("sb-1"))
	random := make([]byte, 64<<10)
	rand.Read(random)
	text := bytes.Repeat([]byte("ctld block store "), 4000)
	for _, compress := range compressions {
		c := testCodec(t, compress)
		for _, kind := range []objKind{kindChunk, kindManifest} {
			want := map[Compression]uint8{CompressNone: 0, CompressS2: flagZstd, CompressZstd: flagZstd}[compress]
			if compress == CompressS2 && kind == kindChunk {
				want = flagS2
			}
			for _, payload := range [][]byte{random, text, {}} {
				blob, err := c.seal(dk, kind, "k", payload)
				if err != nil {
					t.Fatal(err)
				}
				got, err := c.open(dk, kind, "k", blob)
				if err != nil || !bytes.Equal(got, payload) {
					t.Fatalf("%s %s: open = %d bytes, %v", compress, kind, len(got), err)
				}
				// Only a payload that shrinks is stored compressed.
				if f := objFlags(blob); len(payload) == len(text) && f != want || len(payload) != len(text) && f != 0 {
					t.Errorf("%s %s of %d bytes: flags %#x", compress, kind, len(payload), f)
				}
				if compress != CompressNone && len(payload) == len(text) && len(blob) >= len(text)/4 {
					t.Errorf("%s %s: compressible payload of %d bytes sealed to %d", compress, kind, len(text), len(blob))
				}
				if compress == CompressNone && len(blob) < len(payload) {
					t.Errorf("uncompressed seal shrank %d to %d", len(payload), len(blob))
				}
			}
		}
	}
}

// Every flipped byte and every truncation of a sealed object is
// ErrCorrupt, and open returns no data with it: raw, S2 and zstd objects,
// through open and through openTo's pooled path (decrypted in place,
// decoded into the caller's buffer).
func TestOpenRejectsEveryFlipAndTruncation(t *testing.T) {
	dk := testKey(t, Sandbox("sb-1"))
	payload := bytes.Repeat([]byte("abcdefgh"), 512) // compressible
	for _, compress := range compressions {
		c := testCodec(t, compress)
		blob, err := c.seal(dk, kindChunk, "sb/chunks/x", payload)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[Compression]uint8{CompressNone: 0, CompressS2: flagS2, CompressZstd: flagZstd}[compress]; objFlags(blob) != want {
			t.Fatalf("%s: flags %#x, want %#x", compress, objFlags(blob), want)
		}
		dst := make([]byte, len(payload))
		open := func(b []byte) ([]byte, error) {
			got, err := c.open(dk, kindChunk, "sb/chunks/x", b)
			if err == nil || got != nil {
				return got, err
			}
			return c.openTo(dk, kindChunk, "sb/chunks/x", bytes.Clone(b), dst, true)
		}
		for i := range blob {
			for _, bit := range []byte{0x01, 0x80} {
				bad := bytes.Clone(blob)
				bad[i] ^= bit
				got, err := open(bad)
				if !errors.Is(err, ErrCorrupt) || got != nil {
					t.Fatalf("%s flip byte %d bit %#x: open = %d bytes, %v; want ErrCorrupt and nil", compress, i, bit, len(got), err)
				}
			}
		}
		for n := 0; n < len(blob); n++ {
			got, err := open(blob[:n])
			if !errors.Is(err, ErrCorrupt) || got != nil {
				t.Fatalf("%s truncated to %d: open = %d bytes, %v; want ErrCorrupt", compress, n, len(got), err)
			}
		}
		got, err := open(append(bytes.Clone(blob), 0))
		if !errors.Is(err, ErrCorrupt) || got != nil {
			t.Fatalf("%s extended by a byte: open = %d bytes, %v", compress, len(got), err)
		}
		if got, err := c.openTo(dk, kindChunk, "sb/chunks/x", bytes.Clone(blob), dst, true); err != nil || !bytes.Equal(got, payload) {
			t.Fatalf("%s intact: openTo = %d bytes, %v", compress, len(got), err)
		}
	}
}

// An object whose flags name both codecs (3) or a bit no codec has is
// ErrCorrupt even when it authenticates (sealed with the data key): its
// payload is never returned as the plaintext, decoded by a guess or raw.
func TestOpenRejectsUnknownFlags(t *testing.T) {
	dk := testKey(t, Sandbox("sb-1"))
	c := testCodec(t, CompressS2)
	payload := bytes.Repeat([]byte("abcdefgh"), 512)
	for _, z := range [][]byte{s2.EncodeBetter(nil, payload), c.enc.EncodeAll(payload, nil), payload} {
		for _, flags := range []uint8{flagS2 | flagZstd, 4, 4 | flagS2, 4 | flagZstd, 0x80, 0xff} {
			blob, err := sealRaw(dk, kindChunk, "sb/chunks/x", flags, z)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := c.open(dk, kindChunk, "sb/chunks/x", blob); !errors.Is(err, ErrCorrupt) || got != nil {
				t.Fatalf("flags %#x: open = %d bytes, %v; want ErrCorrupt", flags, len(got), err)
			}
			dst := make([]byte, len(payload))
			if got, err := c.openTo(dk, kindChunk, "sb/chunks/x", blob, dst, true); !errors.Is(err, ErrCorrupt) || got != nil {
				t.Fatalf("flags %#x: openTo = %d bytes, %v; want ErrCorrupt", flags, len(got), err)
			}
		}
	}
}

// An S2 object whose block claims more than maxPayload decoded bytes is
// ErrCorrupt before anything of that size is allocated (a data-key holder
// could otherwise make a reader allocate what the varint says).
func TestS2DecodedLengthBounded(t *testing.T) {
	dk := testKey(t, Sandbox("sb-1"))
	c := testCodec(t, CompressS2)
	z := binary.AppendUvarint(nil, maxPayload+1)
	z = append(z, bytes.Repeat([]byte{0}, 64)...)
	blob, err := sealRaw(dk, kindChunk, "sb/chunks/x", flagS2, z)
	if err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	got, err := c.open(dk, kindChunk, "sb/chunks/x", blob)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrCorrupt) || got != nil {
		t.Fatalf("open = %d bytes, %v; want ErrCorrupt", len(got), err)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
		t.Fatalf("open allocated %d bytes for an object of %d", n, len(blob))
	}
}

// A flag's value parses as s2 (also the empty default), zstd or none;
// anything else is an error that names the value and the choices.
func TestParseCompression(t *testing.T) {
	for s, want := range map[string]Compression{"": CompressS2, "s2": CompressS2, "zstd": CompressZstd, "none": CompressNone} {
		if got, err := ParseCompression(s); err != nil || got != want {
			t.Errorf("ParseCompression(%q) = %q, %v; want %q", s, got, err, want)
		}
	}
	for _, s := range []string{"S2", "lz4", "true", "false", "gzip", " s2"} {
		got, err := ParseCompression(s)
		if err == nil || got != "" || !strings.Contains(err.Error(), "want s2, zstd or none") || !strings.Contains(err.Error(), strconv.Quote(s)) {
			t.Errorf("ParseCompression(%q) = %q, %v; want an error naming it and the choices", s, got, err)
		}
	}
	if _, err := newCodec("lz4"); err == nil {
		t.Error(`newCodec("lz4") accepted`)
	}
}

// The AAD binds an object to its key, its kind and its data key.
func TestOpenRejectsSwaps(t *testing.T) {
	c := testCodec(t, CompressNone)
	dk := testKey(t, Sandbox("sb-1"))
	blob, err := c.seal(dk, kindChunk, "sandboxes/sb-1/chunks/aa/a1", []byte("chunk"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.open(dk, kindChunk, "sandboxes/sb-1/chunks/bb/b1", blob); !errors.Is(err, ErrCorrupt) {
		t.Errorf("object read under another key: %v", err)
	}
	if _, err := c.open(dk, kindManifest, "sandboxes/sb-1/chunks/aa/a1", blob); !errors.Is(err, ErrCorrupt) {
		t.Errorf("chunk read as a manifest: %v", err)
	}
	other := testKey(t, Sandbox("sb-2")) // same ID, other secret
	if _, err := c.open(other, kindChunk, "sandboxes/sb-1/chunks/aa/a1", blob); !errors.Is(err, ErrCorrupt) {
		t.Errorf("object opened with another volume's key: %v", err)
	}
}

func TestWrapUnwrap(t *testing.T) {
	nk, _, err := GenerateNodeKey("node-a")
	if err != nil {
		t.Fatal(err)
	}
	secret := bytes.Repeat([]byte{7}, KeySize)
	vol := Sandbox("sb-1")
	blob, err := nk.wrap("dk-1", vol, secret)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(blob, secret[:8]) {
		t.Fatal("wrapped key contains the secret")
	}
	dk, err := nk.unwrap(vol, blob)
	if err != nil || dk.ID() != "dk-1" || dk.Volume() != vol {
		t.Fatalf("unwrap = %v, %v", dk, err)
	}
	if _, err := nk.unwrap(Sandbox("sb-2"), blob); !errors.Is(err, ErrCorrupt) {
		t.Errorf("wrapped key moved to another volume: %v", err)
	}
	other, _, _ := GenerateNodeKey("node-b")
	if _, err := other.unwrap(vol, blob); !errors.Is(err, ErrWrongNodeKey) {
		t.Errorf("unwrap with another node key: %v", err)
	}
	sameID, _, _ := GenerateNodeKey("node-a") // same ID, other secret
	if _, err := sameID.unwrap(vol, blob); !errors.Is(err, ErrCorrupt) {
		t.Errorf("unwrap with a different key of the same ID: %v", err)
	}
	for i := range blob {
		bad := bytes.Clone(blob)
		bad[i] ^= 0x10
		if dk, err := nk.unwrap(vol, bad); err == nil {
			t.Fatalf("flipped byte %d: unwrap succeeded (%s)", i, dk.ID())
		}
	}
	for n := range len(blob) {
		if _, err := nk.unwrap(vol, blob[:n]); err == nil {
			t.Fatalf("truncated to %d: unwrap succeeded", n)
		}
	}
}

func TestKeyRules(t *testing.T) {
	if _, err := NewNodeKey("Node_A", make([]byte, KeySize)); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("bad node key id: %v", err)
	}
	if _, err := NewNodeKey("node-a", make([]byte, 16)); err == nil {
		t.Error("16-byte node key accepted")
	}
	for _, v := range []Volume{{Kind: "x", ID: "a"}, Sandbox(""), Sandbox("../a"), Template("A")} {
		if err := v.Check(); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("volume %q: %v", v, err)
		}
	}
	if v, err := ParseVolume("templates/busybox"); err != nil || v != Template("busybox") {
		t.Errorf("ParseVolume = %v, %v", v, err)
	}
}
