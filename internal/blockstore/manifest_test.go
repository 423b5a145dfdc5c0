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
