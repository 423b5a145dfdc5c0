package blockstore

import (
	"bytes"
	"crypto/rand"
	"errors"
	"testing"
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

func testCodec(t testing.TB, compress bool) *codec {
	t.Helper()
	c, err := newCodec(compress)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestSealOpenRoundTrip(t *testing.T) {
	dk := testKey(t, Sandbox("sb-1"))
	random := make([]byte, 64<<10)
	rand.Read(random)
	text := bytes.Repeat([]byte("ctld block store "), 4000)
	for _, compress := range []bool{false, true} {
		c := testCodec(t, compress)
		for _, payload := range [][]byte{random, text, {}} {
			blob, err := c.seal(dk, kindChunk, "k", payload)
			if err != nil {
				t.Fatal(err)
			}
			got, err := c.open(dk, kindChunk, "k", blob)
			if err != nil || !bytes.Equal(got, payload) {
				t.Fatalf("compress=%v: open = %d bytes, %v", compress, len(got), err)
			}
			if compress && len(payload) == len(text) && len(blob) >= len(text)/4 {
				t.Errorf("compressible payload of %d bytes sealed to %d", len(text), len(blob))
			}
			if !compress && len(blob) < len(payload) {
				t.Errorf("uncompressed seal shrank %d to %d", len(payload), len(blob))
			}
		}
	}
}

// Every flipped byte and every truncation of a sealed object is
// ErrCorrupt, and open returns no data with it.
func TestOpenRejectsEveryFlipAndTruncation(t *testing.T) {
	dk := testKey(t, Sandbox("sb-1"))
	for _, compress := range []bool{false, true} {
		c := testCodec(t, compress)
		payload := bytes.Repeat([]byte("abcdefgh"), 512) // compressible
		blob, err := c.seal(dk, kindChunk, "sb/chunks/x", payload)
		if err != nil {
			t.Fatal(err)
		}
		for i := range blob {
			for _, bit := range []byte{0x01, 0x80} {
				bad := bytes.Clone(blob)
				bad[i] ^= bit
				got, err := c.open(dk, kindChunk, "sb/chunks/x", bad)
				if !errors.Is(err, ErrCorrupt) || got != nil {
					t.Fatalf("compress=%v flip byte %d bit %#x: open = %d bytes, %v; want ErrCorrupt and nil", compress, i, bit, len(got), err)
				}
			}
		}
		for n := 0; n < len(blob); n++ {
			got, err := c.open(dk, kindChunk, "sb/chunks/x", blob[:n])
			if !errors.Is(err, ErrCorrupt) || got != nil {
				t.Fatalf("compress=%v truncated to %d: open = %d bytes, %v; want ErrCorrupt", compress, n, len(got), err)
			}
		}
		got, err := c.open(dk, kindChunk, "sb/chunks/x", append(bytes.Clone(blob), 0))
		if !errors.Is(err, ErrCorrupt) || got != nil {
			t.Fatalf("compress=%v extended by a byte: open = %d bytes, %v", compress, len(got), err)
		}
	}
}

// The AAD binds an object to its key, its kind and its data key.
func TestOpenRejectsSwaps(t *testing.T) {
	c := testCodec(t, false)
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
