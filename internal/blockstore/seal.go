package blockstore

import (
	"crypto/rand"
	"fmt"
	"sync"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
)

// An object as stored (chunk, manifest, head, snapshot or tombstone):
//
//	"CTBO" | version 1 | kind | flags | str dataKeyID | nonce(12) | AES-256-GCM(payload)
//
// The AAD is a domain tag, the object's key in the store and the header
// (magic through key ID): an object moved to another key, read as the other
// kind, or sealed under another volume's key fails authentication. The
// payload is zstd-compressed when flags is flagZstd, S2-compressed (a
// block) when it is flagS2 (either only when that made it smaller); any
// other non-zero flags is ErrCorrupt. Nonces are random (96 bits): per data key that is safe for
// 2^32 objects, 256 TiB of 64 KiB chunks.
const (
	objMagic   = "CTBO"
	objVersion = 1
	flagZstd   = 1
	flagS2     = 2
	aadTag     = "ctld-blockstore/v1 object\x00"
)

type objKind uint8

const (
	kindChunk     objKind = 1
	kindManifest  objKind = 2
	kindHead      objKind = 3
	kindSnapshot  objKind = 4
	kindTombstone objKind = 5
	kindMeta      objKind = 6
)

func (k objKind) String() string {
	switch k {
	case kindChunk:
		return "chunk"
	case kindManifest:
		return "manifest"
	case kindHead:
		return "head"
	case kindSnapshot:
		return "snapshot"
	case kindTombstone:
		return "tombstone"
	case kindMeta:
		return "meta"
	}
	return fmt.Sprintf("kind %d", uint8(k))
}

// Compression names how a repo compresses what it seals. Reading does
// not depend on it: each object's flags say how it was compressed.
type Compression string

const (
	// CompressNone stores payloads as they are (the zero value too).
	CompressNone Compression = "none"
	// CompressS2 compresses chunks with S2 (klauspost/compress/s2) and the
	// other objects with zstd: S2 decodes about three times as fast as
	// zstd (the read path's main cost after the AEAD), for a larger store
	// (a 64 KiB chunk of text: 12.9 KiB against 7.5 KiB). The default.
	CompressS2 Compression = "s2"
	// CompressZstd compresses every object with zstd: the smallest store,
	// the slowest cold reads.
	CompressZstd Compression = "zstd"
)

// ParseCompression checks s, a flag's value; "" is the default, S2.
func ParseCompression(s string) (Compression, error) {
	switch c := Compression(s); c {
	case "":
		return CompressS2, nil
	case CompressNone, CompressS2, CompressZstd:
		return c, nil
	}
	return "", fmt.Errorf("compression %q: want s2, zstd or none", s)
}

// codec seals and opens objects; it holds the zstd coders (safe for
// concurrent EncodeAll/DecodeAll).
type codec struct {
	compress Compression
	enc      *zstd.Encoder
	dec      *zstd.Decoder
	// slack recycles the decode buffers (*[]byte) of openTo.
	slack sync.Pool
}

// zstdSlack is the spare room past a decode's end that lets the zstd
// decoder copy in whole 16- and 32-byte blocks: into a buffer sized
// exactly to the chunk it takes its bounds-exact copies, a third slower
// on 64 KiB chunks of text (1.3 GB/s against 0.95 in a benchmark), more
// than the copy out of a buffer with room costs.
const zstdSlack = 64

func newCodec(compress Compression) (*codec, error) {
	switch compress {
	case "":
		compress = CompressNone
	case CompressNone, CompressS2, CompressZstd:
	default:
		return nil, fmt.Errorf("compression %q: want s2, zstd or none", compress)
	}
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
	if err != nil {
		return nil, fmt.Errorf("zstd encoder: %w", err)
	}
	// The memory cap bounds what a (key-holding) writer could make us
	// allocate; manifests are the largest objects.
	// The frame checksum is not verified: the AEAD has authenticated
	// every compressed byte before the decoder sees it (a third of the
	// decode's CPU on 64 KiB chunks).
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecoderMaxMemory(maxPayload), zstd.IgnoreChecksum(true))
	if err != nil {
		return nil, fmt.Errorf("zstd decoder: %w", err)
	}
	return &codec{compress: compress, enc: enc, dec: dec}, nil
}

// maxPayload bounds a decoded object: a manifest of a 16 TiB device of
// 64 KiB chunks is 2^28 entries... far above what we allow; 256 MiB
// covers 6.5M data entries (a fully written 400 GiB device).
const maxPayload = 256 << 20

func aad(key string, hdr []byte) []byte {
	return appendAAD(make([]byte, 0, len(aadTag)+len(key)+1+len(hdr)), key, hdr)
}

func appendAAD(a []byte, key string, hdr []byte) []byte {
	a = append(a, aadTag...)
	a = append(a, key...)
	a = append(a, 0)
	return append(a, hdr...)
}

func (c *codec) seal(dk *DataKey, kind objKind, key string, payload []byte) ([]byte, error) {
	flags := uint8(0)
	switch {
	case c.compress == CompressS2 && kind == kindChunk:
		if z := s2.EncodeBetter(nil, payload); len(z) < len(payload) {
			payload, flags = z, flagS2
		}
	case c.compress != CompressNone:
		if z := c.enc.EncodeAll(payload, nil); len(z) < len(payload) {
			payload, flags = z, flagZstd
		}
	}
	return sealRaw(dk, kind, key, flags, payload)
}

// sealRaw seals payload as it is, with flags in the header.
func sealRaw(dk *DataKey, kind objKind, key string, flags uint8, payload []byte) ([]byte, error) {
	var e encoder
	e.raw([]byte(objMagic))
	e.u8(objVersion)
	e.u8(uint8(kind))
	e.u8(flags)
	e.str(dk.id)
	hdr := e.bytes()
	nonce := make([]byte, dk.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("seal %s: %w", key, err)
	}
	out := make([]byte, 0, len(hdr)+len(nonce)+len(payload)+dk.aead.Overhead())
	out = append(append(out, hdr...), nonce...)
	return dk.aead.Seal(out, nonce, payload, aad(key, hdr)), nil
}

// open authenticates and decrypts the object stored at key; anything but
// an intact object of this kind, sealed for this key under dk, is
// ErrCorrupt, and no byte of it is returned.
func (c *codec) open(dk *DataKey, kind objKind, key string, blob []byte) ([]byte, error) {
	return c.openTo(dk, kind, key, blob, nil, false)
}

// openTo is open with the payload written to dst's storage when it fits
// (the read path's chunk buffer: no allocation per object). inPlace says
// blob is the caller's scratch: a compressed payload is then decrypted
// over its ciphertext before it is decoded into dst. On an error dst may
// hold garbage (never returned as data): the caller clears it.
func (c *codec) openTo(dk *DataKey, kind objKind, key string, blob, dst []byte, inPlace bool) ([]byte, error) {
	d := decoder{b: blob}
	if string(d.raw(len(objMagic))) != objMagic || d.u8() != objVersion {
		return nil, fmt.Errorf("%w: %s: bad magic or version", ErrCorrupt, key)
	}
	k, flags, id := objKind(d.u8()), d.u8(), d.str()
	hdr := blob[:min(d.off, len(blob))]
	nonce := d.raw(dk.aead.NonceSize())
	if d.err != nil || d.rest() < dk.aead.Overhead() {
		return nil, fmt.Errorf("%w: %s: truncated (%d bytes)", ErrCorrupt, key, len(blob))
	}
	if k != kind {
		return nil, fmt.Errorf("%w: %s: is a %s, want a %s", ErrCorrupt, key, k, kind)
	}
	if id != dk.id {
		return nil, fmt.Errorf("%w: %s: sealed under key %q, the volume's key is %q", ErrCorrupt, key, id, dk.id)
	}
	if flags != 0 && flags != flagZstd && flags != flagS2 {
		return nil, fmt.Errorf("%w: %s: unknown flags %#x", ErrCorrupt, key, flags)
	}
	// Capacity cut to dst's length: decoders use spare capacity as
	// scratch (zstd copies past the end), and the caller may own bytes
	// there (another chunk of the same read).
	dst = dst[:len(dst):len(dst)]
	ct := blob[d.off:]
	var out []byte
	switch {
	case flags == 0 && dst != nil:
		out = dst[:0]
	case flags != 0 && inPlace:
		out = ct[:0] // exact overlap, as cipher.AEAD allows
	}
	var ab [256]byte // the AAD on the stack for the usual key and header
	payload, err := dk.aead.Open(out, nonce, ct, appendAAD(ab[:0], key, hdr))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: authentication failed", ErrCorrupt, key)
	}
	if flags == flagS2 {
		return s2To(key, payload, dst)
	}
	if flags == flagZstd {
		if dst == nil {
			if payload, err = c.dec.DecodeAll(payload, nil); err != nil {
				return nil, fmt.Errorf("%w: %s: zstd: %v", ErrCorrupt, key, err)
			}
			return payload, nil
		}
		return c.decodeTo(key, payload, dst)
	}
	return payload, nil
}

// s2To decodes the S2 block z straight into dst's storage when it fits
// (a new slice if not, or dst is nil). The decoded length, the block's
// first varint, is checked against maxPayload before anything is
// allocated.
func s2To(key string, z, dst []byte) ([]byte, error) {
	n, err := s2.DecodedLen(z)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: s2: %v", ErrCorrupt, key, err)
	}
	if n > maxPayload {
		return nil, fmt.Errorf("%w: %s: s2: %d bytes decoded, more than %d", ErrCorrupt, key, n, maxPayload)
	}
	var into []byte // nil: Decode allocates (not a chunk's size: the caller refuses it)
	if n <= len(dst) {
		into = dst[:n:n]
	}
	out, err := s2.Decode(into, z)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: s2: %v", ErrCorrupt, key, err)
	}
	return out, nil
}

// decodeTo decodes the zstd payload z into dst's storage (a new slice if
// it does not fit), through a buffer with zstdSlack bytes of room.
func (c *codec) decodeTo(key string, z, dst []byte) ([]byte, error) {
	bp, _ := c.slack.Get().(*[]byte)
	if bp == nil || cap(*bp) < len(dst)+zstdSlack {
		b := make([]byte, 0, len(dst)+zstdSlack)
		bp = &b
	}
	defer c.slack.Put(bp)
	out, err := c.dec.DecodeAll(z, (*bp)[:0])
	if err != nil {
		return nil, fmt.Errorf("%w: %s: zstd: %v", ErrCorrupt, key, err)
	}
	if len(out) > len(dst) {
		// Not a chunk's size (the caller refuses it): a copy, as the
		// buffer goes back to the pool.
		return append([]byte(nil), out...), nil
	}
	return dst[:copy(dst, out)], nil
}
