package main

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// An instance that accepts but never answers must not hide the other one,
// and status says what it waited for.
func TestStatusBoundsEachSlot(t *testing.T) {
	g := globalOpts{stateDir: t.TempDir(), runDir: t.TempDir()}
	var conns []net.Conn
	for _, slot := range []string{"a", "b"} {
		ln, err := net.Listen("unix", probePath(g.runDir, slot))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				conns = append(conns, c) // held open, never answered
			}
		}()
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
