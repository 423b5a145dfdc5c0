package blockstore

import (
	"errors"
	"fmt"
	"math/bits"
	"sort"
)

// DefaultChunkSize is the chunk size of new volumes: 64 KiB.
const DefaultChunkSize = 64 << 10

// Chunk sizes are powers of two in [MinChunkSize, MaxChunkSize].
const (
	MinChunkSize = 4 << 10
	MaxChunkSize = 4 << 20
)

// ErrInvalidManifest: a manifest (being built or decoded) breaks a rule.
var ErrInvalidManifest = errors.New("invalid manifest")

// GenRef names one generation of one volume.
type GenRef struct {
	Volume     Volume
	Generation uint64
}

func (g GenRef) String() string { return fmt.Sprintf("%s@%d", g.Volume, g.Generation) }

// EntryKind says what a generation holds for a chunk index.
type EntryKind uint8

const (
	// EntryData: the chunk is the object named by Sum.
	EntryData EntryKind = 1
	// EntryZero: the chunk is all zeros (a hole: no object). It hides the
	// parent's chunk, so a trimmed chunk reads as zeros, not as the base.
	EntryZero EntryKind = 2
)

// Entry is one chunk a generation wrote. Indexes a generation does not
// list are the parent's (or zeros without a parent).
type Entry struct {
	Index uint64
	Kind  EntryKind
	// Sum is the chunk's keyed checksum (HMAC-SHA256 under the volume's
	// data key) for EntryData: it names the object and is checked again
	// after decryption. Zero for EntryZero.
	Sum [32]byte
	// Pack is 0 for a chunk stored as an object of its own (named by
	// Sum), or i+1 for one stored in the manifest's Packs[i]: the sealed
	// chunk is Length bytes at Offset of that pack object. Zero, as are
	// Offset and Length, for EntryZero.
	Pack   uint32
	Offset uint32
	Length uint32
}

// PackID names a pack object of a volume (random).
type PackID [16]byte

// MaxPackObject bounds a pack object (offsets are 32-bit).
const MaxPackObject = 1 << 30

// Manifest is one committed generation of a volume: the chunks it wrote
// over its parent. Generations are immutable; a manifest is the last
// object a commit writes, so its presence means the whole generation is.
type Manifest struct {
	Volume     Volume
	Generation uint64
	Parent     *GenRef // nil: no parent (a template's generation 0)
	DeviceSize uint64
	ChunkSize  uint32
	// Packs are the pack objects (of this manifest's volume) its entries
	// name; empty for a manifest of loose chunk objects only.
	Packs   []PackID
	Entries []Entry // strictly increasing Index
}

// Ref is the manifest's own generation.
func (m *Manifest) Ref() GenRef { return GenRef{Volume: m.Volume, Generation: m.Generation} }

// Chunks is the number of chunks of the device.
func (m *Manifest) Chunks() uint64 { return m.DeviceSize / uint64(m.ChunkSize) }

// checkGeometry validates a device size and chunk size.
func checkGeometry(deviceSize uint64, chunkSize uint32) error {
	if chunkSize < MinChunkSize || chunkSize > MaxChunkSize || bits.OnesCount32(chunkSize) != 1 {
		return fmt.Errorf("%w: chunk size %d is not a power of two in [%d, %d]", ErrInvalidManifest, chunkSize, MinChunkSize, MaxChunkSize)
	}
	if deviceSize == 0 || deviceSize%uint64(chunkSize) != 0 {
		return fmt.Errorf("%w: device size %d is not a positive multiple of the chunk size %d", ErrInvalidManifest, deviceSize, chunkSize)
	}
	return nil
}

// Check validates the manifest: volume, geometry, parent, entries sorted,
// in range, of a known kind.
func (m *Manifest) Check() error {
	if err := m.Volume.Check(); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidManifest, err)
	}
	if err := checkGeometry(m.DeviceSize, m.ChunkSize); err != nil {
		return err
	}
	if p := m.Parent; p != nil {
		if err := p.Volume.Check(); err != nil {
			return fmt.Errorf("%w: parent: %v", ErrInvalidManifest, err)
		}
		// Within a volume generations only grow: no cycle can be built.
		if p.Volume == m.Volume && p.Generation >= m.Generation {
			return fmt.Errorf("%w: %s: parent generation %d is not older", ErrInvalidManifest, m.Ref(), p.Generation)
		}
	}
	for i, p := range m.Packs {
		for _, q := range m.Packs[:i] {
			if p == q {
				return fmt.Errorf("%w: %s: pack %x listed twice", ErrInvalidManifest, m.Ref(), p)
			}
		}
	}
	n := m.Chunks()
	for i, e := range m.Entries {
		if e.Index >= n {
			return fmt.Errorf("%w: %s: chunk %d beyond the device's %d chunks", ErrInvalidManifest, m.Ref(), e.Index, n)
		}
		if i > 0 && e.Index <= m.Entries[i-1].Index {
			return fmt.Errorf("%w: %s: chunk %d out of order or repeated", ErrInvalidManifest, m.Ref(), e.Index)
		}
		switch e.Kind {
		case EntryData:
			if err := m.checkLocation(e); err != nil {
				return err
			}
		case EntryZero:
			if e.Sum != ([32]byte{}) || e.Pack != 0 || e.Offset != 0 || e.Length != 0 {
				return fmt.Errorf("%w: %s: zero chunk %d has a checksum or a location", ErrInvalidManifest, m.Ref(), e.Index)
			}
		default:
			return fmt.Errorf("%w: %s: chunk %d has unknown kind %d", ErrInvalidManifest, m.Ref(), e.Index, e.Kind)
		}
	}
	return nil
}

// checkLocation checks a data entry's place: a loose object, or a range
// of a listed pack no longer than a sealed chunk, within MaxPackObject
// (a reader allocates what Length says: it is bounded here).
func (m *Manifest) checkLocation(e Entry) error {
	if e.Pack == 0 {
		if e.Offset != 0 || e.Length != 0 {
			return fmt.Errorf("%w: %s: loose chunk %d has a pack offset or length", ErrInvalidManifest, m.Ref(), e.Index)
		}
		return nil
	}
	if int(e.Pack) > len(m.Packs) {
		return fmt.Errorf("%w: %s: chunk %d in pack %d of %d", ErrInvalidManifest, m.Ref(), e.Index, e.Pack, len(m.Packs))
	}
	if e.Length == 0 || int64(e.Length) > MaxChunkObject || int64(e.Offset)+int64(e.Length) > MaxPackObject {
		return fmt.Errorf("%w: %s: chunk %d at [%d, +%d) of its pack: not a sealed chunk's size within %d bytes", ErrInvalidManifest, m.Ref(), e.Index, e.Offset, e.Length, MaxPackObject)
	}
	return nil
}

// The manifest encoding (before sealing), big-endian:
//
//	"CTBM" | version 1 | str volume | u64 generation | u8 hasParent
//	[ | str parent volume | u64 parent generation ] | u64 device size
//	| u32 chunk size | u64 n | n × (u64 index | u8 kind [| 32 sum if data])
//
// Version 2 (a manifest with Packs) has the pack list before the entries
// and a location in each data entry:
//
//	... | u32 chunk size | u32 p (≥ 1) | p × 16 pack id | u64 n
//	| n × (u64 index | u8 kind [| 32 sum | u32 pack [| u32 offset | u32 length if pack > 0]])
//
// Only a valid manifest encodes and only the canonical bytes decode
// (sorted entries, no trailing bytes), so a manifest has exactly one
// encoding.
const (
	manifestMagic   = "CTBM"
	manifestVersion = 1
	// manifestPacked is the version of a manifest with packs; one
	// without is still written as version 1.
	manifestPacked = 2
)

// Encode returns the manifest's canonical encoding.
func (m *Manifest) Encode() ([]byte, error) {
	if err := m.Check(); err != nil {
		return nil, err
	}
	var e encoder
	e.b = make([]byte, 0, 64+len(m.Entries)*41)
	packed := len(m.Packs) > 0
	e.raw([]byte(manifestMagic))
	if packed {
		e.u8(manifestPacked)
	} else {
		e.u8(manifestVersion)
	}
	e.str(m.Volume.String())
	e.u64(m.Generation)
	if m.Parent != nil {
		e.u8(1)
		e.str(m.Parent.Volume.String())
		e.u64(m.Parent.Generation)
	} else {
		e.u8(0)
	}
	e.u64(m.DeviceSize)
	e.u32(m.ChunkSize)
	if packed {
		e.u32(uint32(len(m.Packs)))
		for _, p := range m.Packs {
			e.raw(p[:])
		}
	}
	e.u64(uint64(len(m.Entries)))
	for _, en := range m.Entries {
		if !packed && en.Pack != 0 {
			return nil, fmt.Errorf("%w: %s: chunk %d in a pack, no packs listed", ErrInvalidManifest, m.Ref(), en.Index)
		}
		e.u64(en.Index)
		e.u8(uint8(en.Kind))
		if en.Kind == EntryData {
			e.raw(en.Sum[:])
			if packed {
				e.u32(en.Pack)
				if en.Pack != 0 {
					e.u32(en.Offset)
					e.u32(en.Length)
				}
			}
		}
	}
	return e.bytes(), nil
}

// DecodeManifest parses and validates an encoded manifest.
func DecodeManifest(b []byte) (*Manifest, error) {
	d := decoder{b: b}
	if string(d.raw(len(manifestMagic))) != manifestMagic {
		return nil, fmt.Errorf("%w: bad magic or version", ErrInvalidManifest)
	}
	version := d.u8()
	if version != manifestVersion && version != manifestPacked {
		return nil, fmt.Errorf("%w: bad magic or version", ErrInvalidManifest)
	}
	packed := version == manifestPacked
	m := &Manifest{}
	vol, err := ParseVolume(d.str())
	if err != nil && d.err == nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidManifest, err)
	}
	m.Volume = vol
	m.Generation = d.u64()
	switch d.u8() {
	case 0:
	case 1:
		pv, err := ParseVolume(d.str())
		if err != nil && d.err == nil {
			return nil, fmt.Errorf("%w: parent: %v", ErrInvalidManifest, err)
		}
		m.Parent = &GenRef{Volume: pv, Generation: d.u64()}
	default:
		return nil, fmt.Errorf("%w: bad parent flag", ErrInvalidManifest)
	}
	m.DeviceSize = d.u64()
	m.ChunkSize = d.u32()
	if packed {
		np := d.u32()
		// Counts are checked against the bytes left before they size an
		// allocation.
		if d.err == nil && (np == 0 || uint64(np) > uint64(d.rest())/16) {
			return nil, fmt.Errorf("%w: %d packs in %d bytes", ErrInvalidManifest, np, d.rest())
		}
		m.Packs = make([]PackID, np)
		for i := range m.Packs {
			copy(m.Packs[i][:], d.raw(16))
		}
	}
	n := d.u64()
	if d.err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidManifest, d.err)
	}
	// Each entry takes at least 9 bytes: a count beyond that is a lie,
	// refused before it sizes an allocation.
	if n > uint64(d.rest())/9 {
		return nil, fmt.Errorf("%w: %d entries in %d bytes", ErrInvalidManifest, n, d.rest())
	}
	m.Entries = make([]Entry, n)
	for i := range m.Entries {
		en := &m.Entries[i]
		en.Index = d.u64()
		en.Kind = EntryKind(d.u8())
		if en.Kind == EntryData {
			copy(en.Sum[:], d.raw(32))
			if packed {
				if en.Pack = d.u32(); en.Pack != 0 {
					en.Offset, en.Length = d.u32(), d.u32()
				}
			}
		}
	}
	if d.err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidManifest, d.err)
	}
	if d.rest() != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrInvalidManifest, d.rest())
	}
	if err := m.Check(); err != nil {
		return nil, err
	}
	return m, nil
}

// sortEntries orders entries by index (Encode then checks no repeats).
func sortEntries(es []Entry) {
	sort.Slice(es, func(i, j int) bool { return es[i].Index < es[j].Index })
}
