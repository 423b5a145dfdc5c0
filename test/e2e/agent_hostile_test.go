package e2e

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/ha"
	"github.com/ctld/ctld/internal/testutil"
)

// TestGuestAgentHostileAndPrimaryKilledMidStream: a guest process
// (test/e2e/hostileagent, as root) takes its agent's socket (the test
// frees the name on the host: gVisor does not let the guest unlink it)
// and answers garbage, 10 GiB, or nothing. Every call to that sandbox (exec,
// stat, file read and write) fails as unavailable within its bound, while
// another sandbox's calls go on, ctld stays healthy and its peak RSS
// barely moves; runsc exec still reaches the guest, and its release is
// clean. Then the primary is killed with SIGKILL in the middle of an exec
// stream: the caller's stream ends with an error at once (not a hang),
// the guest's command is gone (the agent kills an exec's group when its
// caller's connection closes), and the new primary's execs work.
func TestGuestAgentHostileAndPrimaryKilledMidStream(t *testing.T) {
	const idle = 5 * time.Second
	e := newEnv(t)
	// A short stream bound and file cap keep the silent and huge agents'
	// calls short; the bounds themselves are the client's unit tests'.
	e.args = append(e.args, "--agent-stream-idle", idle.String(), "--max-file-bytes", fmt.Sprint(8<<20))
	e.start("a")
	e.waitPrimary("a", 2*time.Minute)
	e.start("b")
	e.waitRole("b", ha.RoleStandby, time.Minute)
	c := e.client()
	cx := ctx(t, 15*time.Minute)
	for _, id := range []string{"hostile", "calm"} {
		if _, err := c.Claim(cx, id, claimReq("claim-"+id, 1)); err != nil {
			t.Fatalf("claim %s: %v", id, err)
		}
	}
	root := &api.User{}
	takeOverAgent(t, e, c, cx, "hostile", "garbage")

	pid := e.procs["a"].Process.Pid
	hwm := vmHWM(t, pid)
	calmExec := func(when string) {
		t.Helper()
		r, err := c.Exec(cx, "calm", api.ExecRequest{Args: []string{"/bin/echo", "calm"}})
		if err != nil || strings.TrimSpace(string(r.Stdout)) != "calm" {
			t.Errorf("the other sandbox's exec %s: %+v, %v", when, r, err)
		}
	}
	calls := []struct {
		name  string
		bound time.Duration
		call  func(context.Context) error
	}{
		{"exec (timeout 3s)", 3*time.Second + 10*time.Second + 20*time.Second, func(cx context.Context) error {
			_, err := c.Exec(cx, "hostile", api.ExecRequest{Args: []string{"/bin/true"}, TimeoutSec: 3})
			return err
		}},
		{"stat", 10*time.Second + 20*time.Second, func(cx context.Context) error {
			_, err := c.StatFile(cx, "hostile", "/", nil)
			return err
		}},
		{"file read", idle + 20*time.Second, func(cx context.Context) error {
			_, err := c.ReadFileTo(cx, "hostile", "/etc/passwd", nil, io.Discard)
			return err
		}},
		{"file write", idle + 20*time.Second, func(cx context.Context) error {
			return c.WriteFileFrom(cx, "hostile", "/tmp/x", nil, 0o644, strings.NewReader("x"), 1)
		}},
	}
	for _, mode := range []string{"garbage", "huge", "silent"} {
		// The agent's socket is the hostile one's: runsc exec still works.
		var out strings.Builder
		if code, err := c.ExecViaRunsc(cx, "hostile", api.ExecRequest{Args: []string{"/bin/sh", "-c", "echo " + mode + " > /tmp/mode"}, User: root}, &out, &out); err != nil || code != 0 {
			t.Fatalf("set mode %s through runsc exec: %d, %v: %s", mode, code, err, out.String())
		}
		for _, k := range calls {
			cctx, cancel := context.WithTimeout(cx, 5*time.Minute) // the test's own bound, far above k.bound
			began := time.Now()
			err := k.call(cctx)
			took := time.Since(began)
			cancel()
			switch {
			case err == nil:
				t.Errorf("%s agent, %s: answered without error", mode, k.name)
			case codeOf(err) != errdefs.CodeUnavailable:
				t.Errorf("%s agent, %s: %v (code %q), want unavailable", mode, k.name, err, codeOf(err))
			case took > k.bound:
				t.Errorf("%s agent, %s: failed after %v, bound %v: %v", mode, k.name, took.Round(time.Millisecond), k.bound, err)
			}
			t.Logf("%s agent, %s: %v after %v", mode, k.name, err, took.Round(time.Millisecond))
		}
		calmExec("after the " + mode + " agent")
	}
	if _, err := c.Node(cx); err != nil {
		t.Errorf("ctld's node call after the hostile agents: %v", err)
	}
	if grew := vmHWM(t, pid) - hwm; grew > 64<<20 {
		t.Errorf("ctld's peak RSS grew by %d MiB through the hostile agent's calls", grew>>20)
	}
	rel, err := c.Release(cx, "hostile", api.ReleaseRequest{OperationID: "release-hostile", Generation: 1})
	if err != nil || !rel.Proof.Clean {
		t.Fatalf("release of the hostile sandbox: %+v, %v", rel.Proof, err)
	}

	// The primary dies in the middle of an exec stream.
	var out testutil.Buffer
	streamErr := make(chan error, 1)
	go func() {
		_, err := c.ExecStream(cx, "calm", api.ExecRequest{Args: []string{"/bin/sh", "-c", "i=0; while :; do i=$((i+1)); echo tick$i; sleep 1; done"}}, &out, &out)
		streamErr <- err
	}()
	waitFor(t, 2*time.Minute, "the stream's second line", func() bool { return lastNumbered(out.String(), "tick") >= 2 },
		func() string { return fmt.Sprintf("stream output %q", out.String()) })
	killed := time.Now()
	e.kill9("a")
	select {
	case err := <-streamErr:
		if err == nil {
			t.Errorf("the exec stream ended without error when its primary died")
		}
		t.Logf("stream ended %v after the kill: %v", time.Since(killed).Round(time.Millisecond), err)
	case <-time.After(30 * time.Second):
		t.Fatalf("the exec stream was still open 30s after its primary was killed")
	}
	e.waitPrimary("b", time.Minute)
	// The agent saw ctld's connection close and killed the command's group.
	var ps string
	waitFor(t, time.Minute, "the stream's command to be gone from the guest", func() bool {
		r, err := c.Exec(cx, "calm", api.ExecRequest{Args: []string{"/bin/ps"}})
		ps = string(r.Stdout)
		return err == nil && r.ExitCode == 0 && !strings.Contains(ps, "tick")
	}, func() string { return "ps in the guest:\n" + ps })
	calmExec("through the new primary")
	rel, err = c.Release(cx, "calm", api.ReleaseRequest{OperationID: "release-calm", Generation: 1})
	if err != nil || !rel.Proof.Clean {
		t.Fatalf("release of the calm sandbox after the failover: %+v, %v", rel.Proof, err)
	}
}
