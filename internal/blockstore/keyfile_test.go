package blockstore

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// TestNodeKeyCreatedOnce: the node key file is made 0600 on the first
// start and read, unchanged, on the next.
func TestNodeKeyCreatedOnce(t *testing.T) {
	p := filepath.Join(t.TempDir(), "state", "blockstore.key")
	k1, err := LoadOrCreateNodeKeyFile(p, "node")
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, mode %v; want 0600", err, fi.Mode())
	}
	b1, _ := os.ReadFile(p)
	k2, err := LoadOrCreateNodeKeyFile(p, "node")
	b2, _ := os.ReadFile(p)
	if err != nil || string(b1) != string(b2) || k1.ID() != k2.ID() {
		t.Fatalf("second start: %v; the key file changed: %v", err, string(b1) != string(b2))
	}
	if _, err := LoadNodeKeyFile(p+".missing", "node"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("load of a missing key file: %v, want not exist", err)
	}
}
