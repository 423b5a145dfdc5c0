package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/testutil"
)

func TestExitOf(t *testing.T) {
	for x, want := range map[api.ExecExit]int{
		{}:                             0,
		{ExitCode: 3}:                  3,
		{ExitCode: -1, Signal: 9}:      137,
		{ExitCode: -1, Signal: 15}:     143,
		{ExitCode: -1, TimedOut: true}: 124,
		{ExitCode: -1}:                 exitFailed,
	} {
		if got := exitOf(x); got != want {
			t.Errorf("exitOf(%+v) = %d, want %d", x, got, want)
		}
	}
}

// TestCLIExecStreamsAndTTY: exec runs as a session (stdin streamed only
// with -i), -t asks for a terminal of the local size (24x80 without one),
// and the command's exit code is ctl-manager's.
func TestCLIExecStreamsAndTTY(t *testing.T) {
	e := newEnv(t)
	e.ok("sandbox", "create", "sb1")
	if r := e.run("ignored", "sandbox", "exec", "sb1", "--", "cat"); r.code != 0 || r.stdout != "" {
		t.Errorf("exec without -i read stdin: %+v", r)
	}
	if r := e.run("", "sandbox", "exec", "sb1", "--", "sh", "-c", "exit 3"); r.code != 3 || r.stderr != "" {
		t.Errorf("exit 3: %+v", r)
	}
	if r := e.run("", "sandbox", "exec", "sb1", "--", "tty"); r.code != 1 || r.stdout != "not a tty\n" {
		t.Errorf("tty without -t: %+v", r)
	}
	if r := e.run("", "sandbox", "exec", "-t", "sb1", "--", "tty"); r.code != 0 || r.stdout != "/dev/pts/0\n" {
		t.Errorf("tty with -t: %+v", r)
	}
	if r := e.run("stty size\nexit\n", "sandbox", "shell", "sb1"); r.code != 0 || !strings.Contains(r.stdout, "24 80\n") {
		t.Errorf("shell: %+v", r)
	}
	e.node.Lock()
	sessions := e.node.Sessions
	e.node.Unlock()
	last := sessions[len(sessions)-1]
	if !last.TTY || last.Rows != 24 || last.Cols != 80 || last.Args[0] != "/bin/sh" || len(last.Args) != 1 {
		t.Errorf("shell's session: %+v, want /bin/sh on a 24x80 terminal", last)
	}
	if out := e.ok("sandbox", "exec", "--via-runsc", "sb1", "--", "echo", "via", "runsc"); out != "via runsc\n" {
		t.Errorf("exec --via-runsc: %q", out)
	}
	if r := e.run("", "sandbox", "exec", "-t", "--via-runsc", "sb1", "--", "tty"); r.code != exitUsage || !strings.Contains(r.stderr, "do not go together") {
		t.Errorf("-t with --via-runsc: %+v", r)
	}
	e.node.Lock()
	runsc := e.node.RunscExecs
	e.node.Unlock()
	if runsc != 1 {
		t.Errorf("execs via runsc: %d, want 1", runsc)
	}
	if r := e.run("", "sandbox", "exec", "nope", "--", "true"); r.code != exitFailed || !errLine.MatchString(r.stderr) || !strings.Contains(r.stderr, "exec in sandbox nope: not_found") {
		t.Errorf("exec in a missing sandbox: %+v", r)
	}
}

// fakeTerm is a local terminal whose size a test changes.
type fakeTerm struct {
	mu      sync.Mutex
	size    api.TermSize
	raw     []string
	resized chan os.Signal
}

func (f *fakeTerm) Size() (api.TermSize, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.size, true
}

func (f *fakeTerm) MakeRaw() (func(), error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.raw = append(f.raw, "raw")
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.raw = append(f.raw, "restored")
	}, nil
}

func (f *fakeTerm) Resized() (<-chan os.Signal, func()) { return f.resized, func() {} }

// TestCLIShellResize: the shell starts at the local terminal's size, the
// terminal is raw while it runs and restored after, and a resize of the
// local terminal reaches the guest's.
func TestCLIShellResize(t *testing.T) {
	e := newEnv(t)
	e.ok("sandbox", "create", "sb1")
	term := &fakeTerm{size: api.TermSize{Rows: 30, Cols: 100}, resized: make(chan os.Signal, 1)}
	stdinR, stdinW := io.Pipe()
	var out testutil.Buffer
	var errb bytes.Buffer
	c := &cli{stdin: stdinR, stdout: &out, stderr: &errb, term: term}
	done := make(chan int, 1)
	go func() {
		done <- runCLI(context.Background(), c, []string{"--socket", e.socket, "--db", e.db, "sandbox", "shell", "sb1"}, func(string) string { return "" })
	}()
	waitFor := func(want string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(out.String(), want); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no %q in the shell's output %q", want, out.String())
			}
			go io.WriteString(stdinW, "stty size\n") // never blocks the test if the shell is gone
		}
	}
	waitFor("30 100\n")
	term.mu.Lock()
	term.size = api.TermSize{Rows: 50, Cols: 120}
	term.mu.Unlock()
	term.resized <- syscall.SIGWINCH
	waitFor("50 120\n")
	io.WriteString(stdinW, "exit\n")
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("shell exit %d: %s", code, errb.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the shell did not end on exit")
	}
	stdinW.Close()
	term.mu.Lock()
	defer term.mu.Unlock()
	if strings.Join(term.raw, ",") != "raw,restored" {
		t.Errorf("terminal modes: %q, want raw then restored", term.raw)
	}
}

// TestCLIFileCommands: put, get, ls, stat, mkdir, mv and rm through the
// node's file calls, with --user and --mode passed on, and clear errors.
func TestCLIFileCommands(t *testing.T) {
	e := newEnv(t)
	e.ok("sandbox", "create", "sb1")
	local := filepath.Join(t.TempDir(), "big")
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	if err := os.WriteFile(local, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if out := e.ok("sandbox", "file", "put", "--mode", "0600", "sb1", "/tmp/big", local); out != "wrote 1048576 bytes to sb1:/tmp/big\n" {
		t.Errorf("put: %q", out)
	}
	if out := e.ok("sandbox", "file", "get", "sb1", "/tmp/big"); out != string(data) {
		t.Errorf("get: %d bytes, want the 1 MiB put", len(out))
	}
	e.ok("sandbox", "file", "mkdir", "-p", "--mode", "700", "sb1", "/tmp/d/e")
	e.ok("sandbox", "file", "mv", "sb1", "/tmp/big", "/tmp/d/big")
	out := e.ok("sandbox", "file", "ls", "sb1", "/tmp/d")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[0], "-rw-------") || !strings.HasSuffix(lines[0], " big") ||
		!strings.HasPrefix(lines[1], "drwx------") || !strings.HasSuffix(lines[1], " e") {
		t.Errorf("ls:\n%s", out)
	}
	if out := e.ok("sandbox", "file", "stat", "sb1", "/tmp/d/big"); !strings.Contains(out, "1048576") {
		t.Errorf("stat: %q", out)
	}
	var fi api.FileInfo
	if out := e.ok("--json", "sandbox", "file", "stat", "sb1", "/tmp/d/big"); json.Unmarshal([]byte(out), &fi) != nil || fi.Size != 1<<20 || fi.Mode != 0o600 {
		t.Errorf("stat --json: %q", out)
	}
	if r := e.run("", "sandbox", "file", "rm", "sb1", "/tmp/d"); r.code != exitFailed || !errLine.MatchString(r.stderr) || !strings.Contains(r.stderr, "remove /tmp/d in sandbox sb1: conflict") {
		t.Errorf("rm of a full directory without -r: %+v", r)
	}
	e.ok("sandbox", "file", "rm", "-r", "sb1", "/tmp/d")
	if r := e.run("", "sandbox", "file", "ls", "sb1", "/tmp/d"); r.code != exitFailed || !strings.Contains(r.stderr, "list /tmp/d in sandbox sb1: not_found") {
		t.Errorf("ls of a removed directory: %+v", r)
	}
	for _, args := range [][]string{
		{"sandbox", "file", "mkdir", "--mode", "u+rwx", "sb1", "/x"},
		{"sandbox", "file", "put", "--mode", "4755", "sb1", "/x"},
		{"sandbox", "file", "ls", "--user", "root", "sb1", "/"},
		{"sandbox", "file", "mv", "sb1", "/x"},
	} {
		if r := e.run("", args...); r.code != exitUsage {
			t.Errorf("%q: %+v, want a usage error", args, r)
		}
	}
	if r := e.run("", "sandbox", "file", "rm", "-r", "sb1", "/"); r.code != exitFailed || !strings.Contains(r.stderr, "refusing to remove the guest's root") {
		t.Errorf("rm -r /: %+v", r)
	}
}

// TestCLIEscapesGuestTextOnATerminal: a file name with escape sequences,
// a carriage return and a C1 CSI (the guest's to choose) is printed
// escaped when stdout is a terminal, and exact when it is not (a pipe)
// or with --json; an error message carrying such a name is escaped on a
// terminal's stderr.
func TestCLIEscapesGuestTextOnATerminal(t *testing.T) {
	e := newEnv(t)
	e.ok("sandbox", "create", "sb1")
	const evil = "/tmp/\x1b]0;owned\x07\x1b[2Jname\r\u009b"
	local := filepath.Join(t.TempDir(), "f")
	os.WriteFile(local, []byte("x"), 0o600)
	e.ok("sandbox", "file", "put", "sb1", evil, local)
	onTerm := func(args ...string) (string, string, int) {
		var out, errb bytes.Buffer
		c := &cli{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, ttyOut: true, ttyErr: true}
		code := runCLI(context.Background(), c, append([]string{"--socket", e.socket, "--db", e.db}, args...), func(string) string { return "" })
		return out.String(), errb.String(), code
	}
	const escaped = `\x1b]0;owned\a\x1b[2Jname\r\u009b`
	out, _, _ := onTerm("sandbox", "file", "ls", "sb1", "/tmp")
	if !strings.Contains(out, escaped) || strings.ContainsAny(out, "\x1b\x07\r") {
		t.Errorf("ls on a terminal: %q; want the name as %s", out, escaped)
	}
	out, _, _ = onTerm("sandbox", "file", "stat", "sb1", evil)
	if !strings.Contains(out, escaped) || strings.ContainsAny(out, "\x1b\x07\r") {
		t.Errorf("stat on a terminal: %q", out)
	}
	// Not a terminal, or --json: exact.
	if out := e.ok("sandbox", "file", "ls", "sb1", "/tmp"); !strings.Contains(out, evil[len("/tmp/"):]) {
		t.Errorf("ls to a pipe: %q; want the name exact", out)
	}
	out, _, _ = onTerm("--json", "sandbox", "file", "stat", "sb1", evil)
	var fi api.FileInfo
	if err := json.Unmarshal([]byte(out), &fi); err != nil || fi.Name != evil[len("/tmp/"):] {
		t.Errorf("stat --json on a terminal: %q (%v); want the exact name", fi.Name, err)
	}
	// An error naming the path, on a terminal's stderr.
	_, errOut, code := onTerm("sandbox", "file", "ls", "sb1", evil+"/nope")
	if code != exitFailed || strings.ContainsAny(errOut, "\x1b\x07\r") || !strings.Contains(errOut, `\x1b`) {
		t.Errorf("error on a terminal: %d %q; want it escaped", code, errOut)
	}
}
