package node

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ctld/ctld/internal/agent/wire"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/node/guest"
	"github.com/ctld/ctld/internal/runsc"
	"golang.org/x/sys/unix"
)

// TestKernelAgentInGeneration: on the real kernel, every generation's init
// is the guest agent. A claim whose workload runs as uid 1000 is ready
// through the agent's answer, also on a root without /bin/echo; exec runs
// as the workload's user by default and as root when asked; a file
// written through the node is the guest's own (owned by uid 1000) and
// reads back; after a takeover the adopted generation's agent answers;
// release leaves nothing (the agent dirs included).
func TestKernelAgentInGeneration(t *testing.T) {
	ktest.Require(t)
	k := realKernel(t)
	k.noReuse = true
	r := newRig(t, k)
	r.mustBoot()
	ctx := context.Background()
	exec := func(id string, user *wire.User, script string) string {
		t.Helper()
		var out, errb strings.Builder
		code, err := r.n.Exec(ctx, id, ExecRequest{Args: []string{"/bin/sh", "-c", script}, User: user}, &out, &errb)
		if err != nil || code != 0 {
			t.Fatalf("exec %q in %s as %+v: %d, %v, stderr %q", script, id, user, code, err, errb.String())
		}
		return strings.TrimSpace(out.String())
	}
	for _, tmpl := range []string{"busybox", "noecho"} {
		id := "agent-" + tmpl
		req := claimReq("c-"+tmpl, 1)
		req.RootFS.Template = tmpl
		req.Process = journal.Process{UID: 1000, GID: 1000}
		resp := r.mustClaim(id, req)
		tm := resp.Sandbox.Timings
		t.Logf("%s: claim total %.0f ms, runsc %.0f ms, readiness (agent ready) %.0f ms", tmpl, tm.TotalMS, tm.RunscMS, tm.ProofMS)
		if got := exec(id, nil, "id -u; id -g"); got != "1000\n1000" {
			t.Errorf("%s: exec as the workload's user: %q, want 1000 1000", tmpl, got)
		}
		if got := exec(id, &wire.User{UID: 0, GID: 0}, "id -u"); got != "0" {
			t.Errorf("%s: exec as root: %q", tmpl, got)
		}
		// The workload itself runs as uid 1000, a child of the agent (pid 1).
		if got := exec(id, &wire.User{}, "ps -o user,ppid,args | grep '^1000 .*/bin/[s]leep'"); !strings.HasPrefix(got, "1000") || !strings.Contains(got, " 1 ") {
			t.Errorf("%s: workload: %q, want uid 1000 with parent 1", tmpl, got)
		}
		if tmpl == "noecho" {
			if got := exec(id, nil, "test -e /bin/echo && echo has-echo || echo no-echo"); got != "no-echo" {
				t.Errorf("noecho template has /bin/echo: %q", got)
			}
		}
		if err := r.n.WriteFile(ctx, id, "/tmp/from-host", []byte("hello guest")); err != nil {
			t.Fatalf("%s: write file: %v", tmpl, err)
		}
		if b, err := r.n.ReadFile(ctx, id, "/tmp/from-host", 1<<20); err != nil || string(b) != "hello guest" {
			t.Fatalf("%s: read back: %q, %v", tmpl, b, err)
		}
		if got := exec(id, nil, "stat -c %u /tmp/from-host; cat /tmp/from-host"); got != "1000\nhello guest" {
			t.Errorf("%s: the guest's view of the written file: %q", tmpl, got)
		}
	}
	// A takeover: the next term adopts both generations and reaches their
	// agents from the journal alone.
	r.mustBoot()
	if got := exec("agent-busybox", nil, "id -u"); got != "1000" {
		t.Errorf("exec on the adopted generation: %q", got)
	}
	if b, err := r.n.ReadFile(ctx, "agent-noecho", "/tmp/from-host", 1<<20); err != nil || string(b) != "hello guest" {
		t.Errorf("read on the adopted generation: %q, %v", b, err)
	}
	r.mustRelease("agent-busybox", "r1", 1)
	r.mustRelease("agent-noecho", "r2", 1)
	r.checkProof("r1")
	r.checkProof("r2")
	r.checkClean("after release")
	checkUnjournaled(r, crashCase{})
}

// TestKernelAgentSocketDirHostile: the agent socket dir a guest can write
// is a small tmpfs of its own (the guest filling it gets ENOSPC there,
// bytes and inodes, not in the host's /run); a symlink placed at
// agent.sock pointing at a host socket is refused and that socket never
// dialled; a socket served from outside the generation (the host side:
// this test process) is refused by the peer check; the real socket, put
// back, answers; release unmounts it (CheckLeaks, the proof).
func TestKernelAgentSocketDirHostile(t *testing.T) {
	ktest.Require(t)
	k := realKernel(t)
	r := newRig(t, k)
	r.mustBoot()
	ctx := context.Background()
	const id = "agent-sockdir"
	r.mustClaim(id, claimReq("c1", 1))
	root := &wire.User{}
	exec := func(script string) (string, error) {
		var out, errb strings.Builder
		code, err := r.n.Exec(ctx, id, ExecRequest{Args: []string{"/bin/sh", "-c", script}, User: root}, &out, &errb)
		if err == nil && code != 0 {
			err = fmt.Errorf("exit %d, stderr %q", code, errb.String())
		}
		return strings.TrimSpace(out.String()), err
	}
	rec, err := r.n.ready(id)
	if err != nil {
		t.Fatal(err)
	}
	dir := r.n.guest.AgentSockDir(rec.ContainerID)
	var sfs unix.Statfs_t
	if err := unix.Statfs(dir, &sfs); err != nil {
		t.Fatal(err)
	}
	if mp, err := guest.IsMountPoint(dir); !mp || sfs.Type != unix.TMPFS_MAGIC || sfs.Blocks*uint64(sfs.Bsize) != guest.DefaultAgentDirBytes || sfs.Files != guest.DefaultAgentDirInodes {
		t.Fatalf("agent socket dir: mount point %v (%v), fs type %#x, %d bytes, %d inodes; want a tmpfs of its own of %d bytes and %d inodes",
			mp, err, sfs.Type, sfs.Blocks*uint64(sfs.Bsize), sfs.Files, guest.DefaultAgentDirBytes, guest.DefaultAgentDirInodes)
	}
	// The guest fills it: bytes, then inodes (each loop bounded).
	out, err := exec("dd if=/dev/zero of=/.ctl/fill bs=4096 count=1000 2>&1; echo rc=$?")
	if err != nil || !strings.Contains(out, "rc=1") || !strings.Contains(strings.ToLower(out), "no space") {
		t.Errorf("guest filling /.ctl: %q, %v; want ENOSPC", out, err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "fill")); err != nil || fi.Size() > guest.DefaultAgentDirBytes {
		t.Errorf("the fill on the host: %v, %v; want at most %d bytes", fi, err, guest.DefaultAgentDirBytes)
	}
	out, err = exec("rm /.ctl/fill; i=0; while [ $i -lt 1000 ] && touch /.ctl/f$i 2>/dev/null; do i=$((i+1)); done; echo $i; rm -f /.ctl/f*")
	if n, _ := strconv.Atoi(out); err != nil || n < 1 || n >= guest.DefaultAgentDirInodes {
		t.Errorf("guest making files in /.ctl: made %q, %v; want ENOSPC before %d", out, err, guest.DefaultAgentDirInodes)
	}
	t.Logf("guest filled /.ctl: %d bytes of %d, %s files", sfs.Blocks*uint64(sfs.Bsize), guest.DefaultAgentDirBytes, out)

	// agent.sock replaced by a symlink to a host socket.
	sock := filepath.Join(dir, runsc.AgentSocket)
	real := filepath.Join(dir, "real.sock")
	if err := os.Rename(sock, real); err != nil {
		t.Fatal(err)
	}
	hostSock := filepath.Join(t.TempDir(), "host.sock")
	hl, err := net.Listen("unix", hostSock)
	if err != nil {
		t.Fatal(err)
	}
	defer hl.Close()
	var dialled atomic.Int32
	go func() {
		for {
			c, err := hl.Accept()
			if err != nil {
				return
			}
			dialled.Add(1)
			c.Close()
		}
	}()
	if err := os.Symlink(hostSock, sock); err != nil {
		t.Fatal(err)
	}
	if _, err := exec("true"); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("exec through a symlinked agent.sock: %v; want refused, not a socket", err)
	}
	if n := dialled.Load(); n != 0 {
		t.Errorf("the host socket behind the symlink was dialled %d times", n)
	}
	// A socket served from outside the generation.
	os.Remove(sock)
	short := filepath.Join(t.TempDir(), "d") // a socket path has 107 bytes
	if err := os.Symlink(dir, short); err != nil {
		t.Fatal(err)
	}
	fl, err := net.Listen("unix", filepath.Join(short, runsc.AgentSocket))
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := fl.Accept()
			if err != nil {
				return
			}
			dialled.Add(1)
			c.Close()
		}
	}()
	if _, err := exec("true"); err == nil || !strings.Contains(err.Error(), "not in the generation's") {
		t.Errorf("exec through a socket served by the host: %v; want refused by the peer check", err)
	}
	fl.Close()
	os.Remove(sock)
	if err := os.Rename(real, sock); err != nil {
		t.Fatal(err)
	}
	if out, err := exec("echo back"); err != nil || out != "back" {
		t.Errorf("exec through the real socket, put back: %q, %v", out, err)
	}
	r.mustRelease(id, "r1", 1)
	r.checkProof("r1")
	if _, err := os.Lstat(dir); !os.IsNotExist(err) {
		t.Errorf("agent socket dir after release: %v", err)
	}
	r.checkClean("after release")
}
