package guestlog

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestCappedFileBounds: a process's O_APPEND log written through
// CappedFile stays bounded however much is written, and keeps the latest
// lines.
func TestCappedFileBounds(t *testing.T) {
	p := filepath.Join(t.TempDir(), "writer.log")
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const limit = 64 << 10
	c := &CappedFile{W: f, Path: p, Max: limit}
	var last string
	for i := range 100_000 { // ~5 MB
		last = fmt.Sprintf("line %d: nbd request failed\n", i)
		if _, err := c.Write([]byte(last)); err != nil {
			t.Fatal(err)
		}
	}
	cur, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	old, err := os.ReadFile(p + OldSuffix)
	if err != nil {
		t.Fatal(err)
	}
	if len(cur) > limit+limit/4 || len(old) > limit/2 {
		t.Fatalf("log %d bytes and old half %d, want at most %d and %d", len(cur), len(old), limit+limit/4, limit/2)
	}
	if !bytes.HasSuffix(cur, []byte(last)) {
		t.Fatalf("the latest line is not at the end of the log: %q", cur[max(0, len(cur)-100):])
	}
	t.Logf("wrote 100000 lines; log %d bytes, old half %d", len(cur), len(old))
}
