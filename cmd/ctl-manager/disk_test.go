package main

import (
	"strings"
	"testing"
)

// TestCLICreateDisk: --disk is parsed as a quantity and sent as the
// claim's resources.disk_bytes; without it the node's default applies (0
// on the wire); a bad quantity is a usage error that claims nothing.
func TestCLICreateDisk(t *testing.T) {
	e := newEnv(t)
	e.ok("sandbox", "create", "d1", "--disk", "1Gi")
	e.ok("sandbox", "create", "d2")
	r := e.run("", "sandbox", "create", "d3", "--disk", "lots")
	if r.code != 2 || !strings.Contains(r.stderr, "--disk") {
		t.Fatalf("create --disk lots = %+v, want usage error naming --disk", r)
	}
	got := map[string]int64{}
	for _, id := range []string{"d1", "d2", "d3"} {
		if sb, err := e.node.Get(t.Context(), id); err == nil {
			got[id] = sb.Resources.DiskBytes
		}
	}
	if len(got) != 2 || got["d1"] != 1<<30 || got["d2"] != 0 {
		t.Fatalf("claimed disk bytes %v, want d1 1GiB, d2 0 (node default), no d3", got)
	}
	if out := e.ok("sandbox", "get", "d1"); !strings.Contains(out, "disk 1Gi") {
		t.Fatalf("get does not show the disk lease:\n%s", out)
	}
}

// TestCLIGetShowsWriter: a block-mode sandbox's get shows its writer
// (device, pid, epoch, restarts) from the node; an overlay one has none.
func TestCLIGetShowsWriter(t *testing.T) {
	e := newEnv(t)
	e.ok("sandbox", "create", "b1", "--mode", "block")
	e.ok("sandbox", "create", "o1")
	if out := e.ok("sandbox", "get", "b1"); !strings.Contains(out, "  writer:     /dev/nbd0, pid 4242, epoch 1, restarts 0\n") {
		t.Fatalf("get of a block sandbox does not show its writer:\n%s", out)
	}
	if out := e.ok("sandbox", "get", "o1"); strings.Contains(out, "writer:") {
		t.Fatalf("get of an overlay sandbox shows a writer:\n%s", out)
	}
}
