package cowdev

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
)

// The index, replaced whole on each Sync that changed a state:
//
//	"CTCOWIX1" | u32 chunk size | u64 device size | u16 len | base | state per chunk | crc32c
//
// A state is stClean, stData, stZero or stLocal (an older version never
// wrote stLocal, so its indexes read the same).
// Big-endian; the CRC covers everything before it. A torn or foreign index
// is refused (ErrMismatch / a corrupt-index error), never half-trusted.
const indexMagic = "CTCOWIX1"

type indexHeader struct {
	base       string
	chunkSize  uint32
	deviceSize uint64
}

var crcTable = crc32.MakeTable(crc32.Castagnoli)

func encodeIndex(h indexHeader, state []uint8) []byte {
	var b bytes.Buffer
	b.WriteString(indexMagic)
	_ = binary.Write(&b, binary.BigEndian, h.chunkSize)
	_ = binary.Write(&b, binary.BigEndian, h.deviceSize)
	_ = binary.Write(&b, binary.BigEndian, uint16(len(h.base)))
	b.WriteString(h.base)
	b.Write(state)
	_ = binary.Write(&b, binary.BigEndian, crc32.Checksum(b.Bytes(), crcTable))
	return b.Bytes()
}

// readIndex loads the index at path: its header and its states (checked
// against the header's own geometry; Open compares the header with the
// device's).
func readIndex(path string) (indexHeader, []uint8, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return indexHeader{}, nil, err
	}
	fixed := len(indexMagic) + 4 + 8 + 2
	if len(b) < fixed+4 || string(b[:len(indexMagic)]) != indexMagic {
		return indexHeader{}, nil, fmt.Errorf("index %s: corrupt (bad magic or short)", path)
	}
	body, sum := b[:len(b)-4], binary.BigEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, crcTable) != sum {
		return indexHeader{}, nil, fmt.Errorf("index %s: corrupt (checksum)", path)
	}
	p := len(indexMagic)
	got := indexHeader{chunkSize: binary.BigEndian.Uint32(b[p:]), deviceSize: binary.BigEndian.Uint64(b[p+4:])}
	bl := int(binary.BigEndian.Uint16(b[p+12:]))
	if fixed+bl > len(body) || got.chunkSize == 0 {
		return indexHeader{}, nil, fmt.Errorf("index %s: corrupt (short)", path)
	}
	got.base = string(b[fixed : fixed+bl])
	state := body[fixed+bl:]
	if uint64(len(state)) != got.deviceSize/uint64(got.chunkSize) {
		return indexHeader{}, nil, fmt.Errorf("index %s: corrupt (%d states)", path, len(state))
	}
	for i, s := range state {
		if s > stLocal {
			return indexHeader{}, nil, fmt.Errorf("index %s: corrupt (chunk %d state %d)", path, i, s)
		}
	}
	return got, state, nil
}

// mismatch is the error of an index of another base or geometry.
func mismatch(path string, got, want indexHeader) error {
	return fmt.Errorf("%w: index %s is for %s (chunk %d, size %d), not %s (chunk %d, size %d)",
		ErrMismatch, path, got.base, got.chunkSize, got.deviceSize, want.base, want.chunkSize, want.deviceSize)
}

// writeIndex replaces the index atomically: temp file, fsync, rename,
// directory fsync.
func writeIndex(path string, h indexHeader, state []uint8) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("cowdev: write index: %w", err)
	}
	_, err = f.Write(encodeIndex(h, state))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil {
		err = syncDir(filepath.Dir(path))
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("cowdev: write index: %w", err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}
