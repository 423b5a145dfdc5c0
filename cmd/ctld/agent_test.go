package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAgentBinaryCheckedAndStaged: a static executable is accepted and
// staged root-only under the run dir; a script and a non-executable file
// are refused.
func TestAgentBinaryCheckedAndStaged(t *testing.T) {
	const static = "/bin/busybox" // busybox-static: the VM recipe's
	if err := checkAgentBinary(static); err != nil {
		t.Fatalf("static %s refused: %v", static, err)
	}
	dir := t.TempDir()
	script := filepath.Join(dir, "script")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{script: script + ": EOF", plain: "not an executable file"} {
		if err := checkAgentBinary(p); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("checkAgentBinary(%s) = %v, want %q", p, err, want)
		}
	}
	run := filepath.Join(dir, "run")
	got, err := stageAgent(static, run)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(got)
	if err != nil || got != filepath.Join(run, "agent", "ctl-agent") || fi.Mode().Perm() != 0o755 {
		t.Fatalf("staged %s: %v %v", got, fi, err)
	}
	if d, err := os.Stat(filepath.Dir(got)); err != nil || d.Mode().Perm() != 0o700 {
		t.Errorf("stage dir mode %v, %v; want 0700", d.Mode(), err)
	}
}
