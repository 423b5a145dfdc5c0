package writer_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/ctld/ctld/internal/writer"
)

// Stop is idempotent: with no writer, no state and no Dir at all (a
// teardown repeated after the Dir was removed, or a writer whose start
// was journaled but never ran) it succeeds, and CheckGone agrees.
func TestSupervisorStopWithoutDir(t *testing.T) {
	root := t.TempDir()
	sup := &writer.Supervisor{Root: root}
	ctx := context.Background()
	for _, dir := range []string{filepath.Join(root, "never-made"), filepath.Join(root, "emptied")} {
		if filepath.Base(dir) == "emptied" {
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
		}
		for i := range 2 {
			if err := sup.Stop(ctx, dir); err != nil {
				t.Fatalf("Stop %d of %s: %v", i+1, filepath.Base(dir), err)
			}
		}
		if ok, detail := sup.CheckGone(ctx, dir, -1); !ok {
			t.Fatalf("CheckGone of %s: %s", filepath.Base(dir), detail)
		}
	}
}
