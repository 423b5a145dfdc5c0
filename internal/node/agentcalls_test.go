package node

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/agent/client"
	"github.com/ctld/ctld/internal/agent/wire"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
)

// The node's agent calls against the fake kernel's in-process agent: the
// seam (errdefs codes, paths, streams), not the guest (VM kernel tests).

func TestAgentCallsFiles(t *testing.T) {
	tk, _ := fakeKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	r.mustClaim(sb, claimReq("c1", 1))
	n, ctx := r.n, context.Background()

	if err := n.WriteFile(ctx, sb, "/hello", []byte("hi there")); err != nil {
		t.Fatalf("write: %v", err)
	}
	if b, err := n.ReadFile(ctx, sb, "/hello", 100); err != nil || string(b) != "hi there" {
		t.Fatalf("read back: %q, %v", b, err)
	}
	if _, err := n.ReadFile(ctx, sb, "/hello", 3); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
		t.Errorf("read past the limit: %v, want invalid_argument", err)
	}
	if st, err := n.StatFile(ctx, sb, "/hello", nil); err != nil || st.Name != "hello" || st.Size != 8 {
		t.Errorf("stat: %+v, %v", st, err)
	}
	if err := n.MakeDir(ctx, sb, "/d/e", 0o755, true, nil); err != nil {
		t.Fatalf("mkdir: %v", err)
	}
	if err := n.RenameFile(ctx, sb, "/hello", "/d/e/moved", nil); err != nil {
		t.Fatalf("rename: %v", err)
	}
	var out bytes.Buffer
	if got, err := n.ReadFileTo(ctx, sb, "/d/e/moved", &wire.User{UID: 0, GID: 0}, 1<<20, &out); err != nil || got != 8 || out.String() != "hi there" {
		t.Errorf("read the renamed file: %d %q %v", got, out.String(), err)
	}
	if got, err := n.WriteFileFrom(ctx, sb, "/d/big", nil, 0o600, 4, strings.NewReader("too long")); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
		t.Errorf("write past the limit: %d, %v; want invalid_argument", got, err)
	}
	ls, err := n.ListDir(ctx, sb, "/d/e", nil)
	if err != nil || len(ls) != 1 || ls[0].Name != "moved" {
		t.Errorf("list: %+v, %v", ls, err)
	}
	if err := n.RemoveFile(ctx, sb, "/d", true, nil); err != nil {
		t.Fatalf("remove: %v", err)
	}
	for name, err := range map[string]error{
		"read":   func() error { _, err := n.ReadFile(ctx, sb, "/d/e/moved", 100); return err }(),
		"stat":   func() error { _, err := n.StatFile(ctx, sb, "/d", nil); return err }(),
		"remove": n.RemoveFile(ctx, sb, "/d", false, nil),
	} {
		if errdefs.CodeOf(err) != errdefs.CodeNotFound || !strings.Contains(err.Error(), sb) {
			t.Errorf("%s of a removed path: %v, want not_found naming the sandbox", name, err)
		}
	}
	if _, err := n.ListDir(ctx, sb, "relative", nil); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
		t.Errorf("relative path: %v, want invalid_argument", err)
	}
	if _, err := n.StatFile(ctx, "nosuch", "/", nil); errdefs.CodeOf(err) != errdefs.CodeNotFound {
		t.Errorf("unknown sandbox: %v, want not_found", err)
	}
}

// TestAgentCallsExecAndDeadAgent: exec and a session go through the agent
// (stdin reaches the command); once the guest is dead, every call is
// unavailable and names the sandbox, and the node is fine otherwise.
func TestAgentCallsExecAndDeadAgent(t *testing.T) {
	tk, k := fakeKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	resp := r.mustClaim(sb, claimReq("c1", 1))
	n, ctx := r.n, context.Background()
	var out bytes.Buffer
	if code, err := n.Exec(ctx, sb, ExecRequest{Args: []string{"cat"}, Stdin: []byte("in")}, &out, &out); err != nil || code != 0 || out.String() != "in" {
		t.Fatalf("exec cat: %d %q %v", code, out.String(), err)
	}
	out.Reset()
	e, err := n.Session(ctx, sb, ExecRequest{Args: []string{"false"}}, client.Streams{Stdout: &out, Resize: make(chan wire.Resize)})
	if err != nil || e.Code != 1 {
		t.Fatalf("session false: %+v %v", e, err)
	}
	if _, err := n.Exec(ctx, sb, ExecRequest{}, &out, &out); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
		t.Errorf("exec without args: %v", err)
	}
	k.KillGuest(resp.Sandbox.ContainerID)
	if _, err := n.Exec(ctx, sb, ExecRequest{Args: []string{"true"}}, &out, &out); errdefs.CodeOf(err) != errdefs.CodeUnavailable || !strings.Contains(err.Error(), sb) {
		t.Errorf("exec with a dead agent: %v, want unavailable naming %s", err, sb)
	}
	if _, err := n.StatFile(ctx, sb, "/", nil); errdefs.CodeOf(err) != errdefs.CodeUnavailable {
		t.Errorf("stat with a dead agent: %v, want unavailable", err)
	}
	if _, err := n.Node(ctx); err != nil {
		t.Errorf("node after a dead agent's calls: %v", err)
	}
}

// TestClaimRefusesAgentEnv: a workload env may not set the agent's own
// settings (a nonce of its choosing, another uid): refused before the
// journal.
func TestClaimRefusesAgentEnv(t *testing.T) {
	tk, _ := fakeKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	req := claimReq("c1", 1)
	req.Process.Env = []string{"A=b", "CTL_AGENT_NONCE=mine"}
	_, err, _ := r.claim(sb, req)
	if errdefs.CodeOf(err) != errdefs.CodeInvalidArgument || !strings.Contains(err.Error(), "CTL_AGENT_") {
		t.Fatalf("claim with CTL_AGENT_NONCE in env: %v, want invalid_argument", err)
	}
	var ops []journal.Operation
	r.j.View(func(tx *journal.Tx) (err error) { ops, err = tx.Operations(); return err })
	if len(ops) != 0 {
		t.Errorf("a refused claim reached the journal: %+v", ops)
	}
	if s := r.k.text(); slices.ContainsFunc(strings.Split(s, "\n"), func(l string) bool { return l != "" }) {
		t.Errorf("a refused claim left kernel state:\n%s", s)
	}
}

// TestExecNodeBounds: an exec that names no timeout gets the node's
// default (the agent is asked to enforce it); a silent agent or command
// ends a non-TTY exec or session at the node's idle bound with a clear
// reason instead of holding its slot for as long as the caller waits.
func TestExecNodeBounds(t *testing.T) {
	tk, _ := fakeKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	r.mustClaim(sb, claimReq("c1", 1))
	n, ctx := r.n, context.Background()
	n.cfg.ExecTimeoutDefault, n.cfg.ExecIdle = 90*time.Second, 300*time.Millisecond
	n.guest = n.newGuest()
	var out bytes.Buffer
	if _, err := n.Exec(ctx, sb, ExecRequest{Args: []string{"timeout-ms"}}, &out, &out); err != nil || out.String() != "90000" {
		t.Errorf("exec without a timeout: agent asked for %q ms (%v); want the node default 90000", out.String(), err)
	}
	out.Reset()
	if _, err := n.Exec(ctx, sb, ExecRequest{Args: []string{"timeout-ms"}, TimeoutSec: 5}, &out, &out); err != nil || out.String() != "5000" {
		t.Errorf("exec with its own timeout: agent asked for %q ms (%v); want 5000", out.String(), err)
	}
	start := time.Now()
	_, err := n.Exec(ctx, sb, ExecRequest{Args: []string{"silent"}}, &out, &out)
	if errdefs.CodeOf(err) != errdefs.CodeUnavailable || !strings.Contains(err.Error(), "no output and no input for 300ms") || time.Since(start) > 5*time.Second {
		t.Errorf("silent exec: %v after %v; want unavailable at the idle bound", err, time.Since(start))
	}
	_, err = n.Session(ctx, sb, ExecRequest{Args: []string{"silent"}}, client.Streams{Stdout: &out})
	if errdefs.CodeOf(err) != errdefs.CodeUnavailable || !strings.Contains(err.Error(), "no output and no input") {
		t.Errorf("silent non-TTY session: %v; want unavailable at the idle bound", err)
	}
	// A TTY session has no idle bound (a shell waits for its user): the
	// caller's context ends it.
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err = n.Session(cctx, sb, ExecRequest{Args: []string{"silent"}, TTY: true}, client.Streams{Stdout: &out})
	if err == nil || strings.Contains(err.Error(), "no output and no input") {
		t.Errorf("silent TTY session: %v; want the caller's end, not the idle bound", err)
	}
}
