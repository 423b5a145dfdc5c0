package blockstore

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

func sampleManifest() *Manifest {
	return &Manifest{
		Volume:     Sandbox("sb-1"),
		Generation: 3,
		Parent:     &GenRef{Volume: Template("busybox"), Generation: 0},
		DeviceSize: 64 << 20,
		ChunkSize:  DefaultChunkSize,
		Entries: []Entry{
			{Index: 0, Kind: EntryData, Sum: [32]byte{1, 2, 3}},
			{Index: 7, Kind: EntryZero},
			{Index: 1023, Kind: EntryData, Sum: [32]byte{31: 9}},
		},
	}
}

func TestManifestRoundTripIsCanonical(t *testing.T) {
	for _, m := range []*Manifest{sampleManifest(), {Volume: Template("t"), DeviceSize: 4096, ChunkSize: 4096}} {
		b, err := m.Encode()
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeManifest(b)
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Entries) == 0 {
			m.Entries = []Entry{}
		}
		if !reflect.DeepEqual(got, m) {
			t.Fatalf("decoded %+v, want %+v", got, m)
		}
		b2, _ := got.Encode()
		if !bytes.Equal(b, b2) {
			t.Fatal("re-encoding differs")
		}
	}
}

func TestManifestDecodeRejects(t *testing.T) {
	good, err := sampleManifest().Encode()
	if err != nil {
		t.Fatal(err)
	}
	for n := range len(good) {
		if _, err := DecodeManifest(good[:n]); !errors.Is(err, ErrInvalidManifest) {
			t.Fatalf("truncated to %d: %v", n, err)
		}
	}
	if _, err := DecodeManifest(append(bytes.Clone(good), 0)); !errors.Is(err, ErrInvalidManifest) {
		t.Errorf("trailing byte: %v", err)
	}
	// A count of entries far beyond the bytes is refused before any
	// allocation sized by it.
	var e encoder
	e.raw([]byte(manifestMagic))
	e.u8(manifestVersion)
	e.str("sandboxes/sb-1")
	e.u64(1)
	e.u8(0)
	e.u64(1 << 30)
	e.u32(DefaultChunkSize)
	e.u64(1 << 60)
	if _, err := DecodeManifest(e.bytes()); !errors.Is(err, ErrInvalidManifest) {
		t.Errorf("huge count: %v", err)
	}
}

func TestManifestCheck(t *testing.T) {
	for name, mutate := range map[string]func(m *Manifest){
		"unsorted":         func(m *Manifest) { m.Entries[0].Index = 8 },
		"repeated":         func(m *Manifest) { m.Entries[1].Index = 0 },
		"beyond device":    func(m *Manifest) { m.Entries[2].Index = 1024 },
		"unknown kind":     func(m *Manifest) { m.Entries[0].Kind = 3 },
		"zero with sum":    func(m *Manifest) { m.Entries[1].Sum[0] = 1 },
		"chunk not pow2":   func(m *Manifest) { m.ChunkSize = 65 << 10 },
		"chunk too small":  func(m *Manifest) { m.ChunkSize = 2048 },
		"size not aligned": func(m *Manifest) { m.DeviceSize += 512 },
		"size zero":        func(m *Manifest) { m.DeviceSize = 0 },
		"bad volume":       func(m *Manifest) { m.Volume = Sandbox("A/B") },
		"parent not older": func(m *Manifest) { m.Parent = &GenRef{Volume: m.Volume, Generation: 3} },
		"bad parent":       func(m *Manifest) { m.Parent = &GenRef{Volume: Volume{Kind: "x", ID: "y"}} },
	} {
		m := sampleManifest()
		mutate(m)
		if _, err := m.Encode(); !errors.Is(err, ErrInvalidManifest) {
			t.Errorf("%s: Encode = %v, want ErrInvalidManifest", name, err)
		}
	}
}

func FuzzDecodeManifest(f *testing.F) {
	good, _ := sampleManifest().Encode()
	f.Add(good)
	packed, _ := samplePacked().Encode()
	f.Add(packed)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeManifest(b)
		if err != nil {
			return
		}
		// Whatever decodes is canonical.
		again, err := m.Encode()
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("decoded manifest re-encodes differently: %v", err)
		}
	})
}

func samplePacked() *Manifest {
	m := sampleManifest()
	m.Packs = []PackID{{1}, {2}}
	m.Entries[0].Pack, m.Entries[0].Offset, m.Entries[0].Length = 2, 4096, 70000
	m.Entries = append(m.Entries, Entry{Index: 500, Kind: EntryData, Sum: [32]byte{7}, Pack: 1, Length: 100})
	sortEntries(m.Entries)
	return m
}

// A manifest with packs is version 2 and round-trips with its locations;
// one without stays version 1, byte for byte what it was.
func TestManifestPackedRoundTrip(t *testing.T) {
	m := samplePacked()
	b, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if b[len(manifestMagic)] != manifestPacked {
		t.Fatalf("version %d, want %d", b[len(manifestMagic)], manifestPacked)
	}
	got, err := DecodeManifest(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, m) {
		t.Fatalf("decoded %+v, want %+v", got, m)
	}
	if b2, _ := got.Encode(); !bytes.Equal(b, b2) {
		t.Fatal("re-encoding differs")
	}
	for n := range len(b) {
		if _, err := DecodeManifest(b[:n]); !errors.Is(err, ErrInvalidManifest) {
			t.Fatalf("truncated to %d: %v", n, err)
		}
	}
	v1, err := sampleManifest().Encode()
	if err != nil || v1[len(manifestMagic)] != manifestVersion {
		t.Fatalf("a manifest without packs: version %d, %v; want %d", v1[len(manifestMagic)], err, manifestVersion)
	}
	// A count of packs beyond the bytes, and none at all, are refused.
	for _, np := range []uint32{1 << 31, 0} {
		var e encoder
		e.raw([]byte(manifestMagic))
		e.u8(manifestPacked)
		e.str("sandboxes/sb-1")
		e.u64(1)
		e.u8(0)
		e.u64(1 << 30)
		e.u32(DefaultChunkSize)
		e.u32(np)
		e.u64(0)
		if _, err := DecodeManifest(e.bytes()); !errors.Is(err, ErrInvalidManifest) {
			t.Errorf("%d packs: %v", np, err)
		}
	}
}

// A location a reader would trust is checked: a length no sealed chunk
// has (what a reader allocates), a pack not listed, a range past a pack's
// bound, a location on a zero or loose entry, a pack listed twice.
func TestManifestCheckPacked(t *testing.T) {
	for name, mutate := range map[string]func(m *Manifest){
		"length over a chunk": func(m *Manifest) { m.Entries[0].Length = MaxChunkObject + 1 },
		"length zero":         func(m *Manifest) { m.Entries[0].Length = 0 },
		"pack not listed":     func(m *Manifest) { m.Entries[0].Pack = 3 },
		"past the pack bound": func(m *Manifest) { m.Entries[0].Offset = MaxPackObject - 100 },
		"zero in a pack":      func(m *Manifest) { m.Entries[1].Pack = 1 },
		"loose with offset":   func(m *Manifest) { m.Entries[3].Offset = 5 },
		"pack listed twice":   func(m *Manifest) { m.Packs[1] = m.Packs[0] },
		"no packs listed":     func(m *Manifest) { m.Packs = nil },
	} {
		m := samplePacked()
		mutate(m)
		if _, err := m.Encode(); !errors.Is(err, ErrInvalidManifest) {
			t.Errorf("%s: Encode = %v, want ErrInvalidManifest", name, err)
		}
	}
}
