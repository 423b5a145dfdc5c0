package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/manager"
	"github.com/ctld/ctld/internal/manager/fakenode"
	"github.com/ctld/ctld/internal/testutil"
)

type env struct {
	t      *testing.T
	node   *fakenode.Node
	socket string
	db     string
}

func newEnv(t *testing.T) *env {
	n := fakenode.New("node-a")
	return &env{t: t, node: n, socket: fakenode.Serve(t, n), db: filepath.Join(t.TempDir(), "m.db")}
}

type result struct {
	code           int
	stdout, stderr string
}

func (e *env) run(stdin string, args ...string) result {
	e.t.Helper()
	var out, errb bytes.Buffer
	full := append([]string{"--socket", e.socket, "--db", e.db}, args...)
	code := run(context.Background(), full, strings.NewReader(stdin), &out, &errb, func(string) string { return "" })
	return result{code, out.String(), errb.String()}
}

func (e *env) ok(args ...string) string {
	e.t.Helper()
	r := e.run("", args...)
	if r.code != 0 {
		e.t.Fatalf("ctl-manager %v: exit %d\nstdout: %s\nstderr: %s", args, r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// errLine is the one-line error format: "ctl-manager: <what>: <code>: <message>".
var errLine = regexp.MustCompile(`^ctl-manager: [^\n]+: [a-z_]+: [^\n]+\n$`)

func TestCLISandboxLifecycle(t *testing.T) {
	e := newEnv(t)
	out := e.ok("sandbox", "create", "sb1", "--cpu", "0.5", "--memory", "512Mi", "--pids", "64", "--", "sleep", "infinity")
	if !strings.Contains(out, "sandbox sb1 ready: generation 1") || !strings.Contains(out, "operation op-") {
		t.Fatalf("create output:\n%s", out)
	}
	// Exec streams output and exits with the guest's code.
	if out := e.ok("sandbox", "exec", "sb1", "--", "echo", "hello", "world"); out != "hello world\n" {
		t.Fatalf("exec output %q", out)
	}
	// --user reaches the node as a numeric uid and gid; absent, the node
	// picks the sandbox's process user.
	for flag, want := range map[string]string{"": "default\n", "0": "uid=0 gid=0\n", "1000": "uid=1000 gid=1000\n", "1000:50": "uid=1000 gid=50\n"} {
		args := []string{"sandbox", "exec", "sb1", "--", "id"}
		if flag != "" {
			args = []string{"sandbox", "exec", "--user", flag, "sb1", "--", "id"}
		}
		if out := e.ok(args...); out != want {
			t.Errorf("exec --user %q: %q, want %q", flag, out, want)
		}
	}
	r := e.run("", "sandbox", "exec", "sb1", "--", "fail", "7", "oops")
	if r.code != 7 || r.stderr != "oops\n" || r.stdout != "" {
		t.Fatalf("exec fail = %+v, want exit 7 with the guest's stderr only", r)
	}
	r = e.run("piped", "sandbox", "exec", "-i", "sb1", "--", "cat")
	if r.code != 0 || r.stdout != "piped" {
		t.Fatalf("exec stdin = %+v", r)
	}

	// Files: put from stdin and from a local file, get back.
	if r := e.run("from stdin", "sandbox", "file", "put", "sb1", "/tmp/a"); r.code != 0 || !strings.Contains(r.stdout, "wrote 10 bytes") {
		t.Fatalf("file put = %+v", r)
	}
	if out := e.ok("sandbox", "file", "get", "sb1", "/tmp/a"); out != "from stdin" {
		t.Fatalf("file get = %q", out)
	}
	local := filepath.Join(t.TempDir(), "local")
	if err := os.WriteFile(local, []byte("\x00binary\xff"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.ok("sandbox", "file", "put", "sb1", "/b", local)
	if out := e.ok("sandbox", "file", "get", "sb1", "/b"); out != "\x00binary\xff" {
		t.Fatalf("binary round trip = %q", out)
	}

	// ls: human table and JSON.
	out = e.ok("sandbox", "ls")
	if !regexp.MustCompile(`(?m)^ID\s+GEN\s+STATE\s+NODE STATE`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^sb1\s+1\s+ready\s+ready\s+500m\s+512Mi\s+in_sync$`).MatchString(out) {
		t.Fatalf("ls output:\n%s", out)
	}
	var l manager.Listing
	if err := json.Unmarshal([]byte(e.ok("--json", "sandbox", "ls")), &l); err != nil {
		t.Fatal(err)
	}
	if len(l.Sandboxes) != 1 || l.Sandboxes[0].Store.State != api.StateReady || l.Sandboxes[0].Node.Resources.PIDs != 64 {
		t.Fatalf("ls json = %+v", l)
	}

	out = e.ok("sandbox", "get", "sb1")
	if !strings.Contains(out, "recorded:   ready, generation 1, node node-a") || !strings.Contains(out, "operations:") {
		t.Fatalf("get output:\n%s", out)
	}
	var d manager.Detail
	if err := json.Unmarshal([]byte(e.ok("--json", "sandbox", "get", "sb1")), &d); err != nil || d.Node == nil || len(d.Operations) != 1 {
		t.Fatalf("get json = %+v, %v", d, err)
	}

	// destroy prints the verdict; proof verify finds it again.
	out = e.ok("sandbox", "destroy", "sb1")
	m := regexp.MustCompile(`proof (op-[0-9a-f]+) verified: sb1 generation 1 is gone`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("destroy output:\n%s", out)
	}
	out = e.ok("proof", "verify", m[1])
	if !strings.Contains(out, "verified") || !strings.Contains(out, "cgroup_removed") {
		t.Fatalf("proof verify output:\n%s", out)
	}
	var v manager.Verdict
	if err := json.Unmarshal([]byte(e.ok("--json", "proof", "verify", m[1])), &v); err != nil || !v.OK() || v.OperationID != m[1] {
		t.Fatalf("proof verify json = %+v, %v", v, err)
	}
}

func TestCLINodeStatus(t *testing.T) {
	e := newEnv(t)
	out := e.ok("node", "status")
	if !strings.Contains(out, "node node-a (boot boot-1)") || !strings.Contains(out, "role primary, epoch 3") ||
		!regexp.MustCompile(`(?m)^\s+total\s+2\s+4Gi\s+4096`).MatchString(out) {
		t.Fatalf("node status:\n%s", out)
	}
	var st manager.NodeStatus
	if err := json.Unmarshal([]byte(e.ok("--json", "node", "status")), &st); err != nil || st.Node.NodeID != "node-a" || st.Record.Socket != e.socket {
		t.Fatalf("node status json = %+v, %v", st, err)
	}
}

func TestCLINodeWithheld(t *testing.T) {
	e := newEnv(t)
	if out := e.ok("node", "withheld"); out != "no withheld generations\n" {
		t.Fatalf("node withheld with none:\n%s", out)
	}
	if out := e.ok("--json", "node", "withheld"); strings.TrimSpace(out) != "[]" {
		t.Fatalf("node withheld --json with none: %q", out)
	}
	next := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	e.node.Lock()
	e.node.Withheld = []api.WithheldLease{{
		SandboxID: "sb1", Generation: 2, Reason: "released; cleanup unproven: mounts_gone (held)",
		Resources: api.Capacity{CPUMillis: 500, MemoryBytes: 256 << 20, PIDs: 64}, ProofOperationID: "retry-sb1-g2",
		RetryAttempts: 3, NextAttempt: next,
		FailedChecks: []api.ProofCheck{{Name: "mounts_gone", Detail: "overlay superblock 0:45 is detached but alive: held by pid 77 (cwd)"}},
	}}
	e.node.Unlock()
	out := e.ok("node", "withheld")
	for _, want := range []string{"sb1 generation 2: 500m cpu, 256Mi memory, 64 pids withheld", "retries: 3, last -, next 2026-11-30T10:00:00Z; latest proof: retry-sb1-g2",
		"FAILED mounts_gone", "held by pid 77 (cwd)"} {
		if !strings.Contains(out, want) {
			t.Fatalf("node withheld output lacks %q:\n%s", want, out)
		}
	}
	var ws []api.WithheldLease
	if err := json.Unmarshal([]byte(e.ok("--json", "node", "withheld")), &ws); err != nil || len(ws) != 1 || ws[0].FailedChecks[0].Name != "mounts_gone" || !ws[0].NextAttempt.Equal(next) {
		t.Fatalf("node withheld --json = %+v, %v", ws, err)
	}
}

func TestCLIErrors(t *testing.T) {
	e := newEnv(t)
	// A node error is one line with what, code and message; exit 1.
	e.node.Lock()
	e.node.FailClaim = func(api.ClaimRequest) error {
		return errdefs.Errorf(errdefs.CodeCapacityExhausted, "not enough memory")
	}
	e.node.Unlock()
	r := e.run("", "sandbox", "create", "sb1")
	if r.code != exitFailed || r.stderr != "ctl-manager: create sandbox sb1: capacity_exhausted: not enough memory\n" || r.stdout != "" {
		t.Fatalf("create error = %+v", r)
	}
	r = e.run("", "sandbox", "exec", "nope", "--", "echo")
	if r.code != exitFailed || !errLine.MatchString(r.stderr) || !strings.Contains(r.stderr, "exec in sandbox nope: not_found: ") {
		t.Fatalf("exec error = %+v", r)
	}
	r = e.run("", "sandbox", "get", "Bad_ID")
	if r.code != exitFailed || !strings.HasPrefix(r.stderr, "ctl-manager: get sandbox Bad_ID: invalid_argument: ") || !errLine.MatchString(r.stderr) {
		t.Fatalf("bad id error = %+v", r)
	}
	// An unreachable node is unavailable, still one line.
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"--socket", filepath.Join(t.TempDir(), "no.sock"), "--db", e.db, "node", "status"},
		strings.NewReader(""), &out, &errb, func(string) string { return "" })
	if code != exitFailed || !strings.HasPrefix(errb.String(), "ctl-manager: node status: unavailable: ") || !errLine.MatchString(errb.String()) {
		t.Fatalf("unreachable = %d %q", code, errb.String())
	}

	// Usage errors exit 2.
	for _, args := range [][]string{
		{"sandbox", "create"},
		{"sandbox", "create", "a", "b"},
		{"sandbox", "create", "sb1", "--cpu", "lots"},
		{"sandbox", "create", "sb1", "--memory", "12MB"},
		{"sandbox", "exec", "sb1"},
		{"sandbox", "exec", "--user", "root", "sb1", "--", "id"},
		{"sandbox", "exec", "--user", "1000:", "sb1", "--", "id"},
		{"sandbox", "exec", "--user", "-1", "sb1", "--", "id"},
		{"sandbox", "exec", "--user", "4294967296", "sb1", "--", "id"},
		{"sandbox", "get"},
		{"sandbox", "frobnicate"},
		{"--no-such-flag", "sandbox", "ls"},
		{"proof", "verify"},
		{"sandbox", "file", "put", "sb1"},
	} {
		r := e.run("", args...)
		if r.code != 2 || !strings.HasPrefix(r.stderr, "ctl-manager: ") {
			t.Errorf("%v = %+v, want exit 2 with a message", args, r)
		}
	}
	// Nothing was recorded by the usage errors.
	if r := e.run("", "--json", "sandbox", "ls"); r.code != 0 || strings.Contains(r.stdout, `"id"`) && strings.Contains(r.stdout, "\"a\"") {
		t.Fatalf("ls after usage errors = %+v", r)
	}
}

func TestCLIDestroyRejectedProofExitsOne(t *testing.T) {
	e := newEnv(t)
	e.ok("sandbox", "create", "sb1")
	e.ok("sandbox", "destroy", "sb1") // pins the node key
	e.ok("sandbox", "create", "sb2")
	_, impostor, _ := ed25519.GenerateKey(nil)
	e.node.Lock()
	e.node.Signer = impostor
	e.node.Unlock()
	r := e.run("", "sandbox", "destroy", "sb2")
	if r.code != exitFailed || !strings.Contains(r.stdout, "REJECTED") ||
		!strings.HasPrefix(r.stderr, "ctl-manager: destroy sandbox sb2: cleanup proof not accepted: not signed by the pinned key") {
		t.Fatalf("destroy with forged proof = %+v", r)
	}
	r = e.run("", "--json", "sandbox", "destroy", "sb2")
	var d manager.DestroyResult
	if err := json.Unmarshal([]byte(r.stdout), &d); err != nil || r.code != exitFailed || d.Verdict.Verified || !d.AlreadyReleased {
		t.Fatalf("json destroy again = %+v (%v), %+v", d, err, r)
	}
}

func TestCLIDBFromEnv(t *testing.T) {
	e := newEnv(t)
	db := filepath.Join(t.TempDir(), "env.db")
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"--socket", e.socket, "node", "status"}, strings.NewReader(""), &out, &errb,
		func(k string) string {
			if k == "CTL_MANAGER_DB" {
				return db
			}
			return ""
		})
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if _, err := os.Stat(db); err != nil {
		t.Fatalf("database from CTL_MANAGER_DB not created: %v", err)
	}
}

// A node that accepts but never answers: ctl-manager gives up at --timeout
// and says what it waited for.
func TestCLITimeoutSaysWhatItWaitedFor(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "mute.sock")
	testutil.MuteListener(t, sock)
	var out, errb bytes.Buffer
	args := []string{"--socket", sock, "--db", filepath.Join(t.TempDir(), "m.db"), "--timeout", "300ms", "node", "status"}
	done := make(chan int, 1)
	go func() {
		done <- run(context.Background(), args, strings.NewReader(""), &out, &errb, func(string) string { return "" })
	}()
	select {
	case code := <-done:
		if code == 0 {
			t.Fatalf("exit 0 from a mute node; stdout %q", out.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("ctl-manager did not give up at --timeout 300ms")
	}
	if want := "gave up after 300ms (--timeout) waiting for ctld to answer on " + sock; !strings.Contains(errb.String(), want) {
		t.Fatalf("stderr %q does not say %q", errb.String(), want)
	}
}

func TestCLISandboxLogs(t *testing.T) {
	e := newEnv(t)
	e.ok("sandbox", "create", "sb1")
	e.node.Lock()
	e.node.GuestLog["sb1"] = "one\ntwo\nthree\n"
	e.node.Unlock()
	if out := e.ok("sandbox", "logs", "sb1"); out != "one\ntwo\nthree\n" {
		t.Fatalf("logs = %q", out)
	}
	if out := e.ok("sandbox", "logs", "sb1", "--tail", "2"); out != "two\nthree\n" {
		t.Fatalf("logs --tail 2 = %q", out)
	}
	// Nothing comes: the follow gives up after --idle and says why.
	r := e.run("", "sandbox", "logs", "sb1", "--follow", "--tail", "1", "--idle", "1s")
	if r.code != 0 || r.stdout != "three\n" || !strings.Contains(r.stderr, "follow of sandbox sb1 generation 1 ended: no output for 1s") {
		t.Fatalf("follow with no output = %+v", r)
	}
	// New output is printed as it comes, and the follow ends with the generation.
	done := make(chan result, 1)
	go func() { done <- e.run("", "sandbox", "logs", "sb1", "-f", "--tail", "1") }()
	time.Sleep(200 * time.Millisecond)
	e.node.Lock()
	e.node.GuestLog["sb1"] += "four\n"
	e.node.Unlock()
	time.Sleep(200 * time.Millisecond)
	e.ok("sandbox", "destroy", "sb1")
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("follow did not end with the generation")
	}
	if r.code != 0 || r.stdout != "three\nfour\n" || !strings.Contains(r.stderr, "generation 1 ended (released)") {
		t.Fatalf("follow = %+v", r)
	}
	// Logs go with the generation.
	r = e.run("", "sandbox", "logs", "sb1")
	if r.code == 0 || !strings.Contains(r.stderr, "not_found") || !strings.Contains(r.stderr, "removed with it") {
		t.Fatalf("logs after destroy = %+v", r)
	}
	if r := e.run("", "sandbox", "logs", "sb1", "-f", "--idle", "2h"); r.code != 2 || !strings.Contains(r.stderr, "--idle") {
		t.Fatalf("--idle 2h = %+v, want a usage error", r)
	}
}
