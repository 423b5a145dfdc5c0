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
}

// Manifest is one committed generation of a volume: the chunks it wrote
// over its parent. Generations are immutable; a manifest is the last
// object a commit writes, so its presence means the whole generation is.
type Manifest struct {
	Volume     Volume
	Generation uint64
	Parent     *GenRef // nil: no parent (a template's generation 0)
	DeviceSize uint64
	ChunkSize  uint32
	Entries    []Entry // strictly increasing Index
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
		case EntryZero:
			if e.Sum != ([32]byte{}) {
				return fmt.Errorf("%w: %s: zero chunk %d has a checksum", ErrInvalidManifest, m.Ref(), e.Index)
			}
		default:
			return fmt.Errorf("%w: %s: chunk %d has unknown kind %d", ErrInvalidManifest, m.Ref(), e.Index, e.Kind)
		}
	}
	return nil
}

// The manifest encoding (before sealing), big-endian:
//
//	"CTBM" | version 1 | str volume | u64 generation | u8 hasParent
//	[ | str parent volume | u64 parent generation ] | u64 device size
//	| u32 chunk size | u64 n | n × (u64 index | u8 kind [| 32 sum if data])
//
// Only a valid manifest encodes and only the canonical bytes decode
// (sorted entries, no trailing bytes), so a manifest has exactly one
// encoding.
const (
	manifestMagic   = "CTBM"
	manifestVersion = 1
)

// Encode returns the manifest's canonical encoding.
func (m *Manifest) Encode() ([]byte, error) {
	if err := m.Check(); err != nil {
		return nil, err
	}
	var e encoder
	e.b = make([]byte, 0, 64+len(m.Entries)*41)
	e.raw([]byte(manifestMagic))
	e.u8(manifestVersion)
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
	e.u64(uint64(len(m.Entries)))
	for _, en := range m.Entries {
		e.u64(en.Index)
		e.u8(uint8(en.Kind))
		if en.Kind == EntryData {
			e.raw(en.Sum[:])
		}
	}
	return e.bytes(), nil
}

// DecodeManifest parses and validates an encoded manifest.
func DecodeManifest(b []byte) (*Manifest, error) {
	d := decoder{b: b}
	if string(d.raw(len(manifestMagic))) != manifestMagic || d.u8() != manifestVersion {
		return nil, fmt.Errorf("%w: bad magic or version", ErrInvalidManifest)
	}
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
