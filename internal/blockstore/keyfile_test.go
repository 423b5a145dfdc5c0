package blockstore

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
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

// TestNodeKeyFileModeChecked (issue 21): a key file group or others can
// read is refused on load, by both entry points, and left as it is.
func TestNodeKeyFileModeChecked(t *testing.T) {
	p := filepath.Join(t.TempDir(), "blockstore.key")
	if _, err := LoadOrCreateNodeKeyFile(p, "node"); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(p)
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	for name, load := range map[string]func(string, string) (*NodeKey, error){"load": LoadNodeKeyFile, "load or create": LoadOrCreateNodeKeyFile} {
		if _, err := load(p, "node"); err == nil || !strings.Contains(err.Error(), "mode") {
			t.Errorf("%s of a 0644 key file: %v, want refused for its mode", name, err)
		}
	}
	if after, _ := os.ReadFile(p); string(after) != string(before) {
		t.Error("the refused key file was changed")
	}
}

// TestNodeKeyCreatedWhole (issue 21): the key file appears complete or
// not at all, so concurrent first starts (ctld@a and ctld@b, a writer)
// all read the one key that won, never an empty or partial file.
func TestNodeKeyCreatedWhole(t *testing.T) {
	dir := t.TempDir()
	for i := range 200 {
		p := filepath.Join(dir, fmt.Sprintf("k%d", i))
		var wg sync.WaitGroup
		ids := make([]string, 4)
		errs := make([]error, 4)
		for g := range 4 {
			wg.Go(func() {
				k, err := LoadOrCreateNodeKeyFile(p, "node")
				if err == nil {
					ids[g] = hex.EncodeToString(k.aead.Seal(nil, make([]byte, k.aead.NonceSize()), []byte("x"), nil))
				}
				errs[g] = err
			})
		}
		wg.Wait()
		for g := range 4 {
			if errs[g] != nil || ids[g] != ids[0] {
				t.Fatalf("round %d: creator %d: %v, key %s; want all the same key (%s)", i, g, errs[g], ids[g], ids[0])
			}
		}
	}
}
