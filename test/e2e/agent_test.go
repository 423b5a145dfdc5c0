package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
)

// TestBlockClaimRunsNonRoot: a block-mode claim (the root is the ext4 of
// a /dev/nbdX) whose workload runs as uid 1000 gets ready through the
// guest agent; uid 1000 reaches its own / (mode 755) and runs commands;
// exec runs as root when asked; a file written through the files API is
// the guest's own (owned by uid 1000) and reads back; release is clean.
func TestBlockClaimRunsNonRoot(t *testing.T) {
	e := newEnv(t)
	e.startBlock()
	c := e.client()
	req := blockClaimReq("c1", 1, api.Process{UID: 1000, GID: 1000})
	resp, err := c.Claim(ctx(t, 3*time.Minute), "blk", req)
	if err != nil {
		t.Fatalf("block claim as uid 1000: %v", err)
	}
	logTimings(t, "block uid 1000", resp.Sandbox.Timings)
	exec := func(user *api.User, script string) string {
		t.Helper()
		r, err := c.Exec(ctx(t, 2*time.Minute), "blk", api.ExecRequest{Args: []string{"/bin/sh", "-c", script}, User: user})
		if err != nil || r.ExitCode != 0 {
			t.Fatalf("exec %q as %+v: %+v, %v", script, user, r, err)
		}
		return strings.TrimSpace(string(r.Stdout))
	}
	if got := exec(nil, "id -u; stat -c %a /; ls /bin/sh"); got != "1000\n755\n/bin/sh" {
		t.Errorf("uid 1000 in its block root: %q, want 1000, 755, /bin/sh", got)
	}
	if got := exec(&api.User{}, "id -u"); got != "0" {
		t.Errorf("exec as root: %q", got)
	}
	cx := ctx(t, time.Minute)
	if err := c.WriteFile(cx, "blk", "/tmp/note", []byte("from the host")); err != nil {
		t.Fatalf("write file: %v", err)
	}
	if b, err := c.ReadFile(cx, "blk", "/tmp/note"); err != nil || string(b) != "from the host" {
		t.Fatalf("read back: %q, %v", b, err)
	}
	if got := exec(nil, "stat -c %u /tmp/note"); got != "1000" {
		t.Errorf("owner of the written file: %q, want 1000", got)
	}
	rel, err := c.Release(ctx(t, 2*time.Minute), "blk", api.ReleaseRequest{OperationID: "r1", Generation: 1})
	if err != nil || !rel.Proof.Clean {
		t.Fatalf("release: %+v, %v", rel.Proof, err)
	}
}
