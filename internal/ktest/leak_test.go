package ktest

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestGenerationFilesAndDiff: only generation-owned entries of bundles,
// logs and scratch count, and a new one is reported as a leak.
func TestGenerationFilesAndDiff(t *testing.T) {
	run, state := t.TempDir(), t.TempDir()
	mk := func(p string, dir bool) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		var err error
		if dir {
			err = os.Mkdir(p, 0o700)
		} else {
			err = os.WriteFile(p, nil, 0o600)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	// ctld's own files, never a generation's.
	for _, p := range []string{
		filepath.Join(state, "journal.db"), filepath.Join(state, "identity", "node.key"), filepath.Join(state, "ha", "primary.lock"),
		filepath.Join(state, "templates", "busybox-g1", "x"), filepath.Join(run, "ctld.sock"), filepath.Join(run, "ctld-a.sock"),
		filepath.Join(run, "runsc.logs", "runsc.log"), filepath.Join(run, "runsc", "sb-g1_sandbox:sb-g1.state"),
		filepath.Join(state, "scratch", "quota.projid"),
	} {
		mk(p, false)
	}
	before := HostState{Files: GenerationFiles(run, state)}
	if len(before.Files) != 0 {
		t.Fatalf("ctld's own files reported as a generation's: %q", before.Files)
	}
	mk(filepath.Join(run, "bundles", "sb-g1"), true)
	mk(filepath.Join(run, "runsc.logs", "sb-g1"), true)
	mk(filepath.Join(run, "runsc.logs", "old-g2.init.log"), false)
	mk(filepath.Join(state, "scratch", "sb-g1"), true)
	after := HostState{Files: GenerationFiles(run, state)}
	want := []string{
		filepath.Join(run, "bundles", "sb-g1"), filepath.Join(run, "runsc.logs", "old-g2.init.log"),
		filepath.Join(run, "runsc.logs", "sb-g1"), filepath.Join(state, "scratch", "sb-g1"),
	}
	slices.Sort(want)
	if !slices.Equal(after.Files, want) {
		t.Fatalf("generation files %q, want %q", after.Files, want)
	}
	d := Diff(before, after)
	if len(d) != 1 || !strings.HasPrefix(d[0], "generation files left behind: ") || !strings.Contains(d[0], "runsc.logs/sb-g1") {
		t.Fatalf("diff %q", d)
	}
	if d := Diff(after, after); len(d) != 0 {
		t.Fatalf("no change reported as %q", d)
	}
	if got := GenerationFiles("", ""); got != nil {
		t.Fatalf("no dirs asked for: %q", got)
	}
}
