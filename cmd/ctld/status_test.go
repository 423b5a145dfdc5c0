package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/testutil"
)

// An instance that accepts but never answers must not hide the other one,
// and status says what it waited for.
func TestStatusBoundsEachSlot(t *testing.T) {
	g := globalOpts{stateDir: t.TempDir(), runDir: t.TempDir()}
	for _, slot := range []string{"a", "b"} {
		testutil.MuteListener(t, probePath(g.runDir, slot))
	}
	t0 := time.Now()
	r := ctld(t, "--state-dir", g.stateDir, "--run-dir", g.runDir, "status")
	if r.code != exitOK {
		t.Fatalf("status: exit %d, stderr %q", r.code, r.stderr)
	}
	if d := time.Since(t0); d > 3*probeTimeout {
		t.Fatalf("status took %s for two mute slots", d)
	}
	for _, slot := range []string{"a", "b"} {
		want := "ctld@" + slot + "  down     (no answer on " + filepath.Join(g.runDir, "ctld-"+slot+".sock") + " within 2s"
		if !strings.Contains(r.stdout, want) {
			t.Errorf("status output lacks %q:\n%s", want, r.stdout)
		}
	}
}
