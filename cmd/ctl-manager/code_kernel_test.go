package main

import (
	"bytes"
	"context"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/ktest"
)

// TestKernelCode runs snippets in a real gVisor guest (the busybox
// template, language sh) through the service's code call and the CLI's
// code command: one that prints, one that fails with stderr, one that
// reads stdin, one that writes a file the files call reads back, one past
// its timeout; the source never reaches a command line, each run's private
// directory is gone after it. Then code of a hello against exec of the
// same interpreter command in the same sandbox (CTLD_BENCH-free: logged).
func TestKernelCode(t *testing.T) {
	ktest.RequireCgroup2(t, "cpu", "memory", "pids")
	ktest.RequireBinary(t, "runsc")
	socket := startCtld(t)
	e := &env{t: t, socket: socket, db: filepath.Join(t.TempDir(), "manager.db")}
	r := startCodeSandbox(t, e, []string{"--template", "busybox:overlay:sh", "--node-key", filepath.Join(t.TempDir(), "none.key")},
		client.CreateRequest{Template: "busybox", Resources: &client.Resources{CPU: "500m", Memory: "256Mi", PIDs: 128}}, "sh")
	c, sb, code, ctx := r.c, r.sb, r.code, context.Background()

	// Prints.
	if res := code(client.CodeRequest{Language: "sh", Source: "echo hello; echo $((6 * 7))"}); res.ExitCode != 0 || string(res.Stdout) != "hello\n42\n" || len(res.Stderr) != 0 {
		t.Fatalf("print: %+v", res)
	}
	// Fails: its exit code and stderr.
	if res := code(client.CodeRequest{Language: "sh", Source: "echo partial; echo 'boom: no such thing' >&2; exit 3"}); res.ExitCode != 3 ||
		string(res.Stdout) != "partial\n" || string(res.Stderr) != "boom: no such thing\n" {
		t.Fatalf("fail: %+v", res)
	}
	// Reads stdin; env and cwd as exec's.
	if res := code(client.CodeRequest{Language: "sh", Source: `read a; read b; echo "$b $a $GREETING $(pwd)"`, Stdin: []byte("one\ntwo\n"),
		Env: map[string]string{"GREETING": "hi", "PATH": "/bin:/usr/bin"}, Cwd: "/tmp"}); res.ExitCode != 0 || string(res.Stdout) != "two one hi /tmp\n" {
		t.Fatalf("stdin: %+v", res)
	}
	// Writes a file that the files call reads.
	if res := code(client.CodeRequest{Language: "sh", Source: "printf 'made by code\\n' > /tmp/made.txt"}); res.ExitCode != 0 {
		t.Fatalf("write: %+v", res)
	}
	var got bytes.Buffer
	if _, err := c.ReadFile(ctx, sb.ID, "/tmp/made.txt", &got); err != nil || got.String() != "made by code\n" {
		t.Fatalf("files read of the snippet's file = %q, %v", got.String(), err)
	}
	// The interpreter got the file, not the source: its argv is sh and a
	// path in a private directory, whatever quotes the source holds.
	res := code(client.CodeRequest{Language: "sh", Source: "# it's \"quoted\" $(not run) `nor this`\necho \"$0\"; ls -ld \"$(dirname \"$0\")\" | cut -c1-10; cat /proc/self/cmdline | tr '\\0' ' ' | wc -w"})
	lines := strings.Split(strings.TrimSpace(string(res.Stdout)), "\n")
	if res.ExitCode != 0 || len(lines) != 3 || !regexp.MustCompile(`^/tmp/\.ctl-code-[0-9a-f]{32}/main\.sh$`).MatchString(lines[0]) || lines[1] != "drwx------" || lines[2] != "2" {
		t.Fatalf("argv and directory: %+v %q", res, lines)
	}
	// Streamed.
	var out, errb bytes.Buffer
	if n, err := c.CodeStream(ctx, sb.ID, client.CodeRequest{Language: "sh", Source: "echo out; echo err >&2; exit 4"}, &out, &errb); err != nil || n != 4 || out.String() != "out\n" || errb.String() != "err\n" {
		t.Fatalf("stream = %d %q %q, %v", n, out.String(), errb.String(), err)
	}
	// Past its timeout: exec's timeout error, in about the timeout.
	start := time.Now()
	if _, err := c.Code(ctx, sb.ID, client.CodeRequest{Language: "sh", Source: "echo started; sleep 60", TimeoutSec: 2}); err == nil || !strings.Contains(err.Error(), "timed out") {
		t.Fatalf("past its timeout: %v", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("the timed-out snippet took %v", d)
	}
	// A language the template does not serve.
	if _, err := c.Code(ctx, sb.ID, client.CodeRequest{Language: "python", Source: "print(1)"}); err == nil || !strings.Contains(err.Error(), `template "busybox" serves sh, not python`) {
		t.Fatalf("python on busybox: %v", err)
	}

	// The CLI's code, on the same sandbox.
	if r := e.run("", "code", sb.ID, "-l", "sh", "-c", "echo cli; echo cli-err >&2; exit 5"); r.code != 5 || r.stdout != "cli\n" || r.stderr != "cli-err\n" {
		t.Fatalf("cli code: %+v", r)
	}
	if r := e.run("streamed in\n", "code", "-i", sb.ID, "-l", "sh", "-c", "cat"); r.code != 0 || r.stdout != "streamed in\n" {
		t.Fatalf("cli code -i: %+v", r)
	}
	if r := e.run("", "code", sb.ID, "-l", "sh", "--exec-timeout", "2", "-c", "sleep 60"); r.code != exitTimedOut {
		t.Fatalf("cli code past its timeout: %+v, want %d", r, exitTimedOut)
	}

	// No run left its directory.
	ents, err := c.ListFiles(ctx, sb.ID, "/tmp")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, fi := range ents {
		names = append(names, fi.Name)
	}
	if !slices.Equal(names, []string{"made.txt"}) {
		t.Fatalf("/tmp after the runs: %q", names)
	}

	// code of a hello vs exec of the same interpreter command.
	benchCodeVsExec(t, c, sb.ID, 7, client.CodeRequest{Language: "sh", Source: "echo hello"}, []string{"sh", "-c", "echo hello"}, "code sh hello", "exec sh -c hello")
	r.destroy()
}

// codeRig is a sandbox created through a real serve for code tests.
type codeRig struct {
	t         *testing.T
	c         *client.Client
	sb        client.Sandbox
	lang      string
	destroyed bool
}

// startCodeSandbox starts serve (on loopback, with serveArgs) over e's
// ctld and creates a sandbox of req through it with a key of team-a;
// serve stops and the sandbox is destroyed at the test's end, unless
// destroy did it. Its code runs snippets in lang unless they name one.
func startCodeSandbox(t *testing.T, e *env, serveArgs []string, req client.CreateRequest, lang string) *codeRig {
	t.Helper()
	key := strings.TrimSpace(e.ok("key", "create", "--owner", "team-a"))
	base, stop := e.startServe(append([]string{"--listen", "127.0.0.1:0"}, serveArgs...)...)
	t.Cleanup(func() {
		if code := stop(); code != 0 {
			t.Errorf("serve exited %d", code)
		}
	})
	r := &codeRig{t: t, c: &client.Client{BaseURL: base, Key: key}, lang: lang}
	sb, err := r.c.Create(context.Background(), req)
	if err != nil || sb.State != client.StateReady {
		t.Fatalf("create = %+v, %v", sb, err)
	}
	r.sb = sb
	t.Cleanup(func() {
		if !r.destroyed {
			r.c.Destroy(context.Background(), sb.ID)
		}
	})
	return r
}

// code runs req in the sandbox; an error fails the test.
func (r *codeRig) code(req client.CodeRequest) client.ExecResult {
	r.t.Helper()
	if req.Language == "" {
		req.Language = r.lang
	}
	res, err := r.c.Code(context.Background(), r.sb.ID, req)
	if err != nil {
		r.t.Fatalf("code %q: %v", req.Source, err)
	}
	return res
}

// destroy destroys the sandbox and checks its cleanup proof.
func (r *codeRig) destroy() {
	r.t.Helper()
	d, err := r.c.Destroy(context.Background(), r.sb.ID)
	r.destroyed = true
	if err != nil || !d.Proof.Verified {
		r.t.Fatalf("destroy = %+v, %v", d, err)
	}
}

// benchCodeVsExec logs the p50 of n code calls of req against n execs of
// args in sandbox id (each must print "hello"), and their ratio.
func benchCodeVsExec(t *testing.T, c *client.Client, id string, n int, req client.CodeRequest, args []string, codeName, execName string) {
	t.Helper()
	ctx := context.Background()
	var codeD, execD []time.Duration
	for range n {
		t0 := time.Now()
		if res, err := c.Code(ctx, id, req); err != nil || string(res.Stdout) != "hello\n" {
			t.Fatalf("bench code: %+v, %v", res, err)
		}
		codeD = append(codeD, time.Since(t0))
		t0 = time.Now()
		if res, err := c.Exec(ctx, id, client.ExecRequest{Args: args}); err != nil || string(res.Stdout) != "hello\n" {
			t.Fatalf("bench exec: %+v, %v", res, err)
		}
		execD = append(execD, time.Since(t0))
	}
	p50 := func(d []time.Duration) time.Duration {
		slices.Sort(d)
		return d[len(d)/2]
	}
	cp, ep := p50(codeD), p50(execD)
	t.Logf("bench (n=%d, same sandbox): %s p50 %v, %s p50 %v, ratio %.2f", n, codeName, cp, execName, ep, float64(cp)/float64(ep))
}
