package holders

import (
	"os"
	"path/filepath"
	"testing"
)

// TestWhoNamesTheProcess: a holder is described by its comm (spaces and
// parentheses kept), its state and its cgroup v2 path, from its /proc
// directory; what cannot be read is left out.
func TestWhoNamesTheProcess(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got := who(dir); got != "" {
		t.Errorf("who of an empty dir = %q, want nothing", got)
	}
	write("stat", "1429 (runsc (gofer) x) D 1 1429 1429 0 -1\n")
	write("cgroup", "0::/ctld.slice/sb-g1\n")
	if got, want := who(dir), "runsc (gofer) x, state D, cgroup /ctld.slice/sb-g1"; got != want {
		t.Errorf("who = %q, want %q", got, want)
	}
	r := Ref{PID: 1429, Via: "cwd", Who: who(dir)}
	if got, want := r.String(), "pid 1429 (cwd; runsc (gofer) x, state D, cgroup /ctld.slice/sb-g1)"; got != want {
		t.Errorf("ref = %q, want %q", got, want)
	}
}
