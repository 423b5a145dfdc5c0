package overlay

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/resource"
	"github.com/ctld/ctld/internal/templatelock"
)

// stalledFS is a RootFS whose Mount waits for release (a claim stalled
// mid-mount); the rest is never called.
type stalledFS struct {
	RootFS
	entered, release chan struct{}
}

func (f stalledFS) Mount(ctx context.Context, id, lower string) (string, error) {
	close(f.entered)
	<-f.release
	return filepath.Join(lower, "merged-"+id), nil
}

// TestMountHoldsTemplatesLock: while a claim mounts an overlay over a
// template's tree, `template rm`'s exclusive lock waits; once the mount
// is made, it is taken.
func TestMountHoldsTemplatesLock(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "busybox"), 0o755); err != nil {
		t.Fatal(err)
	}
	fs := stalledFS{entered: make(chan struct{}), release: make(chan struct{})}
	o := New(Config{}, Deps{RootFS: fs})
	c := &resource.Claim{Rec: journal.Sandbox{ID: "a", ContainerID: "a-1"}, Lower: filepath.Join(dir, "busybox")}
	made := make(chan error, 1)
	go func() { made <- mountResource{o}.Make(t.Context(), c) }()
	<-fs.entered
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if unlock, err := templatelock.Exclusive(ctx, dir); !errors.Is(err, context.DeadlineExceeded) {
		if err == nil {
			unlock()
		}
		t.Fatalf("exclusive lock during the mount: %v, want it to wait (deadline exceeded)", err)
	}
	close(fs.release)
	if err := <-made; err != nil {
		t.Fatal(err)
	}
	unlock, err := templatelock.Exclusive(t.Context(), dir)
	if err != nil {
		t.Fatalf("exclusive lock after the mount: %v", err)
	}
	unlock()
}
