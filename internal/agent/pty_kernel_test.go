package agent_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/agent/client"
	"github.com/ctld/ctld/internal/agent/wire"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/testutil"
)

// ptyEnd bounds how long a PTY exec may take to end once its command
// exited (the TCG VM runs a guest fork+exec in tens of milliseconds).
const ptyEnd = 30 * time.Second

// TestKernelAgentPTYUnderRunsc runs PTY execs through ctl-agent as the init
// of a runsc guest (workload uid 1000). gVisor's PTY master never reports a
// hangup (a read does not fail with EIO once no replica is open), so an exec
// ends on its command's exit alone: each ends in time with the command's
// exit code, the size asked for and a resize reach the terminal, the output
// written right before the exit is all there, and neither an ended nor an
// abandoned PTY exec leaves a descriptor (or a reader blocked on one) in the
// agent, nor a process.
//
// Outside the VM it runs on the host's runsc when CTLD_AGENT_HOST_RUNSC=1
// (root; --network=none, --ignore-cgroups).
func TestKernelAgentPTYUnderRunsc(t *testing.T) {
	host := !ktest.Asked() && os.Getenv("CTLD_AGENT_HOST_RUNSC") == "1"
	var bin string
	if host {
		if ok, why := hostRunsc(); !ok {
			t.Skipf("host run needs runsc as root (%s)", why)
		}
		bin = filepath.Join(t.TempDir(), "ctl-agent")
		cmd := exec.Command("go", "build", "-o", bin, "github.com/ctld/ctld/cmd/ctl-agent")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build ctl-agent: %v\n%s", err, out)
		}
	} else {
		ktest.Require(t)
		ktest.RequireBinary(t, "runsc")
		ktest.RequireCgroup2(t, "cpu", "memory", "pids")
		bin = agentBinary(t)
	}
	const nonce = "pty-n0nce"
	g := startGuest(t, guestOpts{id: "agent-pty", nonce: nonce, bin: bin, host: host})
	if got := g.waitReady(t); got != nonce {
		t.Fatalf("ready = %q, want %q", got, nonce)
	}
	root := &wire.User{}
	// guestRun runs a plain (pipe) command as guest root.
	guestRun := func(args ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		e, err := g.c.Exec(ctxT(t, time.Minute), client.ExecRequest{Args: args, User: root}, client.Streams{Stdout: &out, Stderr: &errb})
		if err != nil || e.Code != 0 {
			t.Fatalf("guest %q: %+v %v, stderr %q", args, e, err, errb.String())
		}
		return out.String()
	}
	// The agent's descriptors (it is the guest's pid 1), seen from a
	// plain exec (a glob: ls would stat each, and fail on one closed
	// meanwhile). The baseline is the fewest of a few looks: the
	// readiness polls' connections may still be closing.
	agentFDs := func() int { return len(strings.Fields(guestRun("sh", "-c", "echo /proc/1/fd/*"))) }
	before := agentFDs()
	for range 5 {
		time.Sleep(200 * time.Millisecond)
		before = min(before, agentFDs())
	}

	// ptyExec runs args on a PTY (24x80) as the workload's user; when the
	// output first holds "ready" it sends resize (if any). It fails the
	// test unless the exec ends within ptyEnd of its start.
	ptyExec := func(name string, args []string, resize *wire.Resize) (string, wire.Exit) {
		t.Helper()
		var out testutil.Buffer
		rs := make(chan wire.Resize, 1)
		type end struct {
			e   wire.Exit
			err error
		}
		ended := make(chan end, 1)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		start := time.Now()
		go func() {
			e, err := g.c.Exec(ctx, client.ExecRequest{Args: args, TTY: true, Rows: 24, Cols: 80}, client.Streams{Stdout: &out, Resize: rs})
			ended <- end{e, err}
		}()
		sent := resize == nil
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case r := <-ended:
				if r.err != nil {
					t.Fatalf("%s: %v; output %q", name, r.err, out.String())
				}
				t.Logf("%s: %+v after %v", name, r.e, time.Since(start).Round(time.Millisecond))
				return out.String(), r.e
			case <-tick.C:
				if !sent && strings.Contains(out.String(), "ready") {
					rs <- *resize
					sent = true
				}
				if time.Since(start) > ptyEnd {
					t.Fatalf("%s: the PTY exec did not end within %v; output so far %q", name, ptyEnd, out.String())
				}
			}
		}
	}

	out, e := ptyExec("tty", []string{"tty"}, nil)
	if !regexp.MustCompile(`^/dev/pts/\d+\r\n$`).MatchString(out) || e != (wire.Exit{}) {
		t.Errorf("tty: %q, %+v; want a /dev/pts path and exit 0", out, e)
	}
	out, e = ptyExec("id and size", []string{"sh", "-c", "id -u; stty size; exit 3"}, nil)
	if out != "1000\r\n24 80\r\n" || e != (wire.Exit{Code: 3}) {
		t.Errorf("id -u; stty size; exit 3: %q, %+v; want \"1000\\r\\n24 80\\r\\n\" and exit 3", out, e)
	}
	// A resize: polled, not trapped (whether SIGWINCH comes is gVisor's).
	out, e = ptyExec("resize", []string{"sh", "-c", `stty size; echo ready; while [ "$(stty size)" = "24 80" ]; do sleep 0.05; done; stty size; exit 4`},
		&wire.Resize{Rows: 40, Cols: 100})
	if out != "24 80\r\nready\r\n40 100\r\n" || e != (wire.Exit{Code: 4}) {
		t.Errorf("resize: %q, %+v; want 24 80, ready, 40 100 and exit 4", out, e)
	}
	// What the command wrote right before it exited is all delivered,
	// more than a PTY's buffer holds.
	const n = 200000
	out, e = ptyExec("drain", []string{"sh", "-c", `head -c 200000 /dev/zero | tr '\0' x; exit 5`}, nil)
	if len(out) != n || strings.Trim(out, "x") != "" || e != (wire.Exit{Code: 5}) {
		t.Errorf("drain: %d bytes (%d not x), %+v; want %d x and exit 5", len(out), len(strings.Trim(out, "x")), e, n)
	}

	// A shell's job control puts a background job in a group of its
	// own: the exec's session is killed with it, not only its group.
	out, e = ptyExec("job control", []string{"sh", "-c", `set -m; sleep 4343 & echo job $(cut -d' ' -f5,6 /proc/$!/stat) $$; exit 6`}, nil)
	if f := strings.Fields(out); len(f) != 4 || f[0] != "job" || f[1] == f[3] || f[2] != f[3] || e != (wire.Exit{Code: 6}) {
		t.Errorf("job control: %q, %+v; want \"job <own group> <the shell's session> <shell>\" and exit 6", out, e)
	}
	for deadline := time.Now().Add(ptyEnd); strings.Contains(guestRun("ps", "-o", "pid,args"), "sleep 4343"); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the background job of an ended PTY exec still runs:\n%s", guestRun("ps", "-o", "pid,args"))
		}
	}

	// A caller that goes away mid-command: its group is killed and the
	// agent lets go of the PTY.
	var ab testutil.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan error, 1)
	go func() {
		_, err := g.c.Exec(ctx, client.ExecRequest{Args: []string{"sh", "-c", "echo ready; exec sleep 4242"}, TTY: true}, client.Streams{Stdout: &ab})
		gone <- err
	}()
	for deadline := time.Now().Add(ptyEnd); !strings.Contains(ab.String(), "ready"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("abandoned PTY exec: no \"ready\" in %v: %q", ptyEnd, ab.String())
		}
	}
	cancel()
	if err := <-gone; err == nil {
		t.Error("cancelled PTY exec returned no error")
	}
	var after int
	var ps string
	for deadline := time.Now().Add(ptyEnd); ; time.Sleep(100 * time.Millisecond) {
		after, ps = agentFDs(), guestRun("ps", "-o", "pid,args")
		if after <= before && !strings.Contains(ps, "sleep 4242") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the PTY execs the agent holds %d descriptors, %d before; guest processes:\n%s", after, before, ps)
		}
	}
	t.Logf("agent descriptors: %d before the PTY execs, %d after", before, after)
}
