package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/mountinfo"
	"github.com/ctld/ctld/internal/runsc"
	"golang.org/x/sys/unix"
)

// TestGuestIdentityAndFileKinds: a guest's processes run as the claim's
// user (exec, and the workload the agent starts) and are not protected from the OOM killer by
// ctld's own oom_score_adj; the file API (the guest's view, as the
// workload's user) refuses FIFOs, sockets, device nodes and directories
// without hanging; a claim the lease would refuse
// never reaches the journal.
func TestGuestIdentityAndFileKinds(t *testing.T) {
	e := newEnv(t)
	e.start("a")
	e.waitPrimary("a", 60*time.Second)
	// As the shipped unit does (OOMScoreAdjust=-900): runsc must not
	// inherit it.
	ctldPID := e.procs["a"].Process.Pid
	writeOOMScoreAdj(t, ctldPID, -900)
	c := e.client()
	cx := ctx(t, 6*time.Minute)

	req := claimReq("claim-ids-1", 1)
	req.Process = api.Process{UID: 1000, GID: 1000}
	// The agent answers the readiness proof only once it started the
	// workload as uid 1000: the claim proves that user runs in the guest.
	res, err := c.Claim(cx, "ids", req)
	if err != nil {
		t.Fatalf("claim with process uid 1000: %v", err)
	}
	cid := res.Sandbox.ContainerID

	t.Run("exec user", func(t *testing.T) {
		for _, tc := range []struct {
			user *api.User
			want string
		}{
			{nil, "1000 1000"}, // the workload's user by default
			{&api.User{UID: 0, GID: 0}, "0 0"},
			{&api.User{UID: 1234, GID: 99}, "1234 99"},
		} {
			r, err := c.Exec(cx, "ids", api.ExecRequest{Args: []string{"/bin/sh", "-c", "echo $(id -u) $(id -g)"}, User: tc.user})
			if err != nil || r.ExitCode != 0 {
				t.Fatalf("exec as %+v: %+v, %v", tc.user, r, err)
			}
			if got := strings.TrimSpace(string(r.Stdout)); got != tc.want {
				t.Errorf("exec as %+v runs as %q, want %q", tc.user, got, tc.want)
			}
		}
	})

	t.Run("oom score adj", func(t *testing.T) {
		procs := runscProcesses(t, filepath.Join(e.runDir, "runsc"), cid)
		if len(procs) < 2 {
			t.Fatalf("found %d runsc processes of %s, want the sandbox and the gofer: %v", len(procs), cid, procs)
		}
		for _, p := range procs {
			if got := readOOMScoreAdj(t, p.pid); got != runsc.DefaultGuestOOMScoreAdj {
				t.Errorf("runsc process %d (%s) has oom_score_adj %d, want %d (ctld has %d)", p.pid, p.what, got, runsc.DefaultGuestOOMScoreAdj, readOOMScoreAdj(t, ctldPID))
			} else {
				t.Logf("runsc process %d (%s): oom_score_adj %d", p.pid, p.what, got)
			}
		}
	})

	t.Run("exec makes no host process", func(t *testing.T) {
		// The guest agent runs an exec inside the guest: unlike a runsc
		// exec, nothing of it lives on the host (nothing to protect from
		// the OOM killer, nothing a killed client leaves behind).
		done := make(chan error, 1)
		go func() {
			_, err := c.Exec(cx, "ids", api.ExecRequest{Args: []string{"/bin/sleep", "5"}})
			done <- err
		}()
		for deadline := time.Now().Add(4 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			for _, p := range runscProcesses(t, filepath.Join(e.runDir, "runsc"), cid) {
				if strings.HasSuffix(p.what, " exec") {
					t.Fatalf("a runsc exec process (%d) runs for an exec through the agent", p.pid)
				}
			}
		}
		if err := <-done; err != nil {
			t.Fatalf("exec sleep: %v", err)
		}
	})

	t.Run("file kinds", func(t *testing.T) {
		root := guestRoot(t, cid)
		must := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
		}
		// The files API is the guest's view through its agent, as the
		// workload's user (uid 1000). A FIFO made in the guest, the guest's
		// own /dev/zero, a directory: refused by kind, without hanging.
		if r, err := c.Exec(cx, "ids", api.ExecRequest{Args: []string{"mkfifo", "/tmp/gfifo"}}); err != nil || r.ExitCode != 0 {
			t.Fatalf("mkfifo in the guest: %+v, %v", r, err)
		}
		// Made on the host side, in the overlay (so in its upper), as a
		// template could leave them: the guest's gofer does not serve them.
		must(unix.Mkfifo(filepath.Join(root, "fifo"), 0o666))
		must(unix.Mknod(filepath.Join(root, "sock"), unix.S_IFSOCK|0o666, 0))
		must(unix.Mknod(filepath.Join(root, "zero"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 5))))
		kinds := map[string]string{"/tmp/gfifo": "FIFO", "/dev/zero": "character device", "/zero": "character device", "/etc": "directory",
			"/fifo": "", "/sock": ""}
		for p, kind := range kinds {
			// A hang is the failure under test: bound each call.
			fx, cancel := context.WithTimeout(cx, 15*time.Second)
			_, rerr := c.ReadFile(fx, "ids", p)
			werr := c.WriteFile(fx, "ids", p, []byte("x"))
			cancel()
			for verb, err := range map[string]error{"read": rerr, "write": werr} {
				switch {
				case kind == "" && (err == nil || codeOf(err) == errdefs.CodeUnavailable):
					t.Errorf("%s %s (made on the host): %v; want refused by the guest", verb, p, err)
				case kind != "" && (codeOf(err) != errdefs.CodeInvalidArgument || !strings.Contains(err.Error(), "not a regular file ("+kind+")")):
					t.Errorf("%s %s: %v; want invalid_argument: not a regular file (%s)", verb, p, err, kind)
				}
			}
		}
		if fi, err := os.Lstat(filepath.Join(root, "fifo")); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
			t.Errorf("the FIFO was replaced: %v, %v", fi, err)
		}
		// Regular files work both ways, where the workload's user may write.
		must(c.WriteFile(cx, "ids", "/tmp/note", []byte("hi")))
		if b, err := c.ReadFile(cx, "ids", "/tmp/note"); err != nil || string(b) != "hi" {
			t.Errorf("read back /tmp/note: %q, %v", b, err)
		}
		if err := c.WriteFile(cx, "ids", "/note", []byte("hi")); codeOf(err) != errdefs.CodePermissionDenied {
			t.Errorf("uid 1000 writing into root's /: %v, want permission_denied", err)
		}
	})

	t.Run("bad claim never journaled", func(t *testing.T) {
		// Passed the API before (1 <= cpu_millis) but not the lease (>= 10):
		// it was journaled, then rolled back.
		bad := claimReq("claim-bad-1", 1)
		bad.Resources.CPUMillis = 5
		if _, err := c.Claim(cx, "bad", bad); codeOf(err) != errdefs.CodeInvalidArgument {
			t.Fatalf("claim with cpu_millis 5: %v, want invalid_argument", err)
		}
		if sb, err := c.Get(cx, "bad"); codeOf(err) != errdefs.CodeNotFound {
			t.Fatalf("after a refused claim, GET sandbox = %+v, %v; want not_found (no journal record)", sb, err)
		}
	})

	if _, err := c.Release(cx, "ids", api.ReleaseRequest{OperationID: "release-ids-1", Generation: 1}); err != nil {
		t.Fatalf("release: %v", err)
	}
}

type proc struct {
	pid  int
	what string
}

// runscProcesses finds the runsc processes (sandbox, gofer) of container
// cid under runsc root dir by their command lines.
func runscProcesses(t *testing.T, root, cid string) []proc {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []proc
	for _, ent := range ents {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		argv := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if !strings.HasPrefix(filepath.Base(argv[0]), "runsc") || !slices.Contains(argv, "--root="+root) {
			continue
		}
		if !slices.ContainsFunc(argv, func(a string) bool { return strings.Contains(a, cid) }) {
			continue
		}
		what := argv[0]
		for _, a := range argv[1:] {
			if a == "boot" || a == "gofer" || a == "exec" {
				what += " " + a
			}
		}
		out = append(out, proc{pid, what})
	}
	return out
}

func readOOMScoreAdj(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func writeOOMScoreAdj(t *testing.T, pid, v int) {
	t.Helper()
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid), []byte(strconv.Itoa(v)), 0); err != nil {
		t.Fatal(err)
	}
}

// guestRoot is the host path of the guest's overlay root (found by its
// mount, not by ctld's directory layout).
func guestRoot(t *testing.T, cid string) string {
	t.Helper()
	ms, err := mountinfo.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var roots []string
	for _, m := range ms {
		if m.FSType == "overlay" && slices.Contains(strings.Split(m.MountPoint, "/"), cid) {
			roots = append(roots, m.MountPoint)
		}
	}
	if len(roots) != 1 {
		t.Fatalf("overlay mounts of %s: %v, want one", cid, roots)
	}
	return roots[0]
}
