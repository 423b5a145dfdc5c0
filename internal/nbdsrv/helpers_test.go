package nbdsrv_test

import (
	"bytes"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/ctld/ctld/internal/nbdsrv"
	"github.com/ctld/ctld/internal/nbdsrv/nbdtest"
)

// serveFile serves the file at path.
func serveFile(t testing.TB, path string, readOnly bool) *nbdtest.Served {
	t.Helper()
	f, err := nbdsrv.OpenFile(path, readOnly)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() }) // runs after serve's stop: cleanups run last-in first-out
	return nbdtest.Serve(t, nbdsrv.Export{Name: "test", Backend: f, ReadOnly: readOnly}, nbdsrv.Options{})
}

// refImage writes a deterministic image of size bytes: random data with
// zero runs and holes, so sparse-aware copiers take their zero paths too.
func refImage(t *testing.T, path string, size int64) []byte {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, size)
	const blk = 256 << 10
	for off := int64(0); off < size; off += blk {
		end := min(off+blk, size)
		switch (off / blk) % 5 {
		case 1, 3: // zeros
		default:
			for i := off; i < end; i += 8 {
				v := rng.Uint64()
				for j := int64(0); j < 8 && i+j < end; j++ {
					b[i+j] = byte(v >> (8 * j))
				}
			}
		}
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	for off := int64(0); off < size; off += blk {
		chunk := b[off:min(off+blk, size)]
		if bytes.Count(chunk, []byte{0}) == len(chunk) {
			continue // leave a hole
		}
		if _, err := f.WriteAt(chunk, off); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// sparseFile creates an all-hole file of size bytes.
func sparseFile(t testing.TB, path string, size int64) {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
}

func sameFile(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%s: %d bytes, want %d", path, len(got), len(want))
	}
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && got[i] == want[i] {
			i++
		}
		t.Fatalf("%s differs from the reference first at byte %d", path, i)
	}
}
