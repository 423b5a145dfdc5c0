package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestCLIVolume: volume create makes an empty volume ls shows with its
// size and head 1; a second create is refused; sandbox create --volume
// passes the mount to the node (a malformed flag is a usage error); rm is
// refused while the sandbox holds the volume and works once it is
// destroyed, after which ls shows none and rm again fails.
func TestCLIVolume(t *testing.T) {
	for _, b := range []string{"mkfs.ext4", "debugfs", "e2fsck"} {
		if _, err := exec.LookPath(b); err != nil {
			t.Fatalf("%s not installed (e2fsprogs): %v", b, err)
		}
	}
	e := newEnv(t)
	dir := t.TempDir()
	store := []string{"--store", filepath.Join(dir, "store"), "--node-key", filepath.Join(dir, "node.key")}
	vol := func(args ...string) result {
		return e.run("", append(append([]string{"volume"}, args...), store...)...)
	}
	if r := vol("create", "data", "--size", "1000"); r.code != exitUsage {
		t.Errorf("create --size 1000: exit %d, want usage\n%s", r.code, r.stderr)
	}
	if r := vol("create", "data", "--size", "8Mi"); r.code != 0 || !strings.Contains(r.stdout, "volume data: 8Mi, head 1") {
		t.Fatalf("create: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := vol("create", "data", "--size", "8Mi"); r.code != exitFailed || !strings.Contains(r.stderr, "volume exists") {
		t.Errorf("second create: exit %d\n%s", r.code, r.stderr)
	}
	if r := vol("ls"); r.code != 0 || !strings.Contains(r.stdout, "data") || !strings.Contains(r.stdout, "8Mi") {
		t.Errorf("ls: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := e.run("", "sandbox", "create", "sb", "--volume", "data"); r.code != exitUsage {
		t.Errorf("--volume without a path: exit %d, want usage\n%s", r.code, r.stderr)
	}
	e.ok("sandbox", "create", "sb", "--volume", "data:/data")
	sb, err := e.node.Get(t.Context(), "sb")
	if err != nil {
		t.Fatal(err)
	}
	if v := sb.Volumes; len(v) != 1 || v[0].ID != "data" || v[0].Path != "/data" || v[0].ExpectHead.Seq != 1 {
		t.Errorf("the node's sandbox has volumes %+v, want data at /data, expecting head 1 (volume create's)", v)
	}
	if r := vol("rm", "data"); r.code != exitFailed || !strings.Contains(r.stderr, "attached to sandbox sb") {
		t.Errorf("rm while attached: exit %d\n%s", r.code, r.stderr)
	}
	e.ok("sandbox", "destroy", "sb")
	if r := vol("rm", "data"); r.code != 0 {
		t.Fatalf("rm: exit %d\n%s", r.code, r.stderr)
	}
	if r := vol("ls"); r.code != 0 || !strings.Contains(r.stdout, "no volumes") {
		t.Errorf("ls after rm: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := vol("rm", "data"); r.code != exitFailed || !strings.Contains(r.stderr, "volume not found") {
		t.Errorf("second rm: exit %d\n%s", r.code, r.stderr)
	}
	// The manager remembers the deletion (the bucket's tombstone may go):
	// the ID is not reused, and a claim naming it never reaches the node.
	if r := vol("create", "data", "--size", "8Mi"); r.code != exitFailed || !strings.Contains(r.stderr, "was deleted") {
		t.Errorf("create of a deleted volume's ID: exit %d\n%s", r.code, r.stderr)
	}
	if r := e.run("", "sandbox", "create", "sb2", "--volume", "data:/data"); r.code != exitFailed || !strings.Contains(r.stderr, "volume data was deleted") {
		t.Errorf("claim of a deleted volume: exit %d\n%s", r.code, r.stderr)
	}
}
