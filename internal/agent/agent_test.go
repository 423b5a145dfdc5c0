package agent_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/agent"
	"github.com/ctld/ctld/internal/agent/client"
	"github.com/ctld/ctld/internal/agent/wire"
)

// The test binary doubles as the agent: a real process on a real socket.
const helperEnv = "CTL_AGENT_TEST_HELPER"

func TestMain(m *testing.M) {
	// The pre-forked workload process of a warm agent has no environment.
	if os.Getenv(helperEnv) == "1" || len(os.Args) > 1 && os.Args[1] == agent.ExecHelperArg {
		os.Exit(agent.Main(os.Args[1:], os.Environ(), os.Stderr))
	}
	os.Exit(m.Run())
}

type agentProc struct {
	cmd    *exec.Cmd
	socket string
	c      *client.Client
}

// startAgent runs the agent process with nonce and the current uid/gid as
// the workload's user, and waits for its socket.
func startAgent(t *testing.T, extra ...string) *agentProc {
	t.Helper()
	return startAgentUnder(t, nil, extra...)
}

// startAgentUnder runs the agent under a wrapper command (e.g. strace).
func startAgentUnder(t *testing.T, wrapper []string, extra ...string) *agentProc {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "agent.sock")
	argv := append(append(wrapper[:len(wrapper):len(wrapper)], os.Args[0], "--socket", sock, "--nonce-file", writeNonce(t, dir, "nonce-123")), extra...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = agentEnv()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		if t.Failed() {
			t.Logf("agent stderr:\n%s", stderr.String())
		}
	})
	for i := 0; ; i++ {
		// Dial, not stat: the file exists from bind(2), before listen(2).
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			break
		}
		if i == 500 {
			t.Fatalf("agent socket never appeared: %s", stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return &agentProc{cmd: cmd, socket: sock, c: &client.Client{Socket: sock}}
}

// writeNonce writes the agent's nonce file in dir as ctld does (0400).
func writeNonce(t *testing.T, dir, nonce string) string {
	t.Helper()
	p := filepath.Join(dir, "nonce")
	if err := os.WriteFile(p, []byte(nonce), 0o400); err != nil {
		t.Fatal(err)
	}
	return p
}

// agentEnv is the agent's environment: the test binary as the agent, the
// current uid/gid as the workload's.
func agentEnv() []string {
	return append(os.Environ(), helperEnv+"=1",
		fmt.Sprintf("%s=%d", agent.EnvUID, os.Getuid()), fmt.Sprintf("%s=%d", agent.EnvGID, os.Getgid()))
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func run(t *testing.T, c *client.Client, r client.ExecRequest, stdin io.Reader) (string, string, wire.Exit) {
	t.Helper()
	var out, errb bytes.Buffer
	e, err := c.Exec(ctxT(t, 30*time.Second), r, client.Streams{Stdin: stdin, Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatalf("exec %q: %v", r.Args, err)
	}
	return out.String(), errb.String(), e
}

func TestReadyAnswersNonce(t *testing.T) {
	a := startAgent(t)
	n, err := a.c.Ready(ctxT(t, 10*time.Second))
	if err != nil || n != "nonce-123" {
		t.Fatalf("ready = %q, %v; want nonce-123", n, err)
	}
}

func TestExecAsCurrentUser(t *testing.T) {
	a := startAgent(t)
	out, _, e := run(t, a.c, client.ExecRequest{Args: []string{"id", "-u"}}, nil)
	if strings.TrimSpace(out) != strconv.Itoa(os.Getuid()) || e.Code != 0 {
		t.Fatalf("id -u = %q, %+v; want %d", out, e, os.Getuid())
	}
	// The workload's environment does not carry the agent's settings.
	out, _, _ = run(t, a.c, client.ExecRequest{Args: []string{"env"}}, nil)
	if strings.Contains(out, "CTL_AGENT") {
		t.Fatalf("exec env carries the agent's settings: %q", out)
	}
}

func TestExecAsOtherUserAndNonceHidden(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run as another uid (the VM test covers it)")
	}
	a := startAgent(t)
	u := &wire.User{UID: 65534, GID: 65534}
	out, _, _ := run(t, a.c, client.ExecRequest{Args: []string{"id", "-u"}, User: u}, nil)
	if strings.TrimSpace(out) != "65534" {
		t.Fatalf("id -u as 65534 = %q", out)
	}
	// Nobody reads the nonce in the agent's environment or argv, nor in
	// its file, which the agent removed before it listened: not another
	// user, not root.
	pid := a.cmd.Process.Pid
	nonceFile := filepath.Join(filepath.Dir(a.socket), "nonce")
	for _, u := range []*wire.User{u, {UID: 0, GID: 0}} {
		for _, p := range []string{fmt.Sprintf("/proc/%d/environ", pid), fmt.Sprintf("/proc/%d/cmdline", pid), nonceFile} {
			out, errOut, e := run(t, a.c, client.ExecRequest{Args: []string{"cat", p}, User: u}, nil)
			if strings.Contains(out, "nonce-123") {
				t.Fatalf("uid %d read the nonce in %s: exit %+v, %q %q", u.UID, p, e, out, errOut)
			}
		}
	}
	if _, err := os.Lstat(nonceFile); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("nonce file %s still there after the agent started: %v", nonceFile, err)
	}
	// And it still knows it.
	if n, err := a.c.Ready(ctxT(t, 10*time.Second)); n != "nonce-123" {
		t.Fatalf("ready = %q, %v", n, err)
	}
}

func TestExecStreamsInOrder(t *testing.T) {
	a := startAgent(t)
	script := `i=0; while [ $i -lt 300 ]; do echo out$i; echo err$i >&2; i=$((i+1)); done`
	out, errb, e := run(t, a.c, client.ExecRequest{Args: []string{"sh", "-c", script}}, nil)
	if e.Code != 0 {
		t.Fatalf("exit %+v", e)
	}
	for name, s := range map[string]string{"out": out, "err": errb} {
		lines := strings.Split(strings.TrimSpace(s), "\n")
		if len(lines) != 300 {
			t.Fatalf("%s: %d lines", name, len(lines))
		}
		for i, l := range lines {
			if l != fmt.Sprintf("%s%d", name, i) {
				t.Fatalf("%s line %d = %q", name, i, l)
			}
		}
	}
}

func TestExecStdin(t *testing.T) {
	a := startAgent(t)
	in := strings.Repeat("hello agent\n", 20000) // 240 KB: several frames
	out, _, e := run(t, a.c, client.ExecRequest{Args: []string{"cat"}}, strings.NewReader(in))
	if out != in || e.Code != 0 {
		t.Fatalf("cat echoed %d bytes (exit %+v), want %d", len(out), e, len(in))
	}
}

func TestExecExitCodesAndSignals(t *testing.T) {
	a := startAgent(t)
	if _, _, e := run(t, a.c, client.ExecRequest{Args: []string{"sh", "-c", "exit 7"}}, nil); e.Code != 7 {
		t.Fatalf("exit 7: %+v", e)
	}
	if _, _, e := run(t, a.c, client.ExecRequest{Args: []string{"sh", "-c", "kill -TERM $$"}}, nil); e.Signal != 15 || e.Code != -1 {
		t.Fatalf("self TERM: %+v", e)
	}
	if _, err := a.c.Exec(ctxT(t, 10*time.Second), client.ExecRequest{Args: []string{"/no/such/binary"}}, client.Streams{}); err == nil {
		t.Fatal("exec of a missing binary succeeded")
	} else if we := (*wire.Error)(nil); !errors.As(err, &we) || we.Code != wire.CodeNotFound {
		t.Fatalf("missing binary: %v; want a not_found agent error", err)
	}
	// A signal from the caller reaches the command.
	sig := make(chan int, 1)
	var out bytes.Buffer
	pr, pw := io.Pipe()
	go func() {
		// Signal once the command said it runs.
		br := bufio.NewReader(pr)
		br.ReadString('\n')
		sig <- int(syscall.SIGINT)
		io.Copy(io.Discard, br)
	}()
	e, err := a.c.Exec(ctxT(t, 20*time.Second), client.ExecRequest{Args: []string{"sh", "-c", "echo up; exec sleep 100"}},
		client.Streams{Stdout: io.MultiWriter(&out, pw), Signal: sig})
	pw.Close()
	if err != nil || e.Signal != int(syscall.SIGINT) {
		t.Fatalf("signalled exec: %+v, %v", e, err)
	}
}

func TestExecTimeout(t *testing.T) {
	a := startAgent(t)
	start := time.Now()
	_, _, e := run(t, a.c, client.ExecRequest{Args: []string{"sleep", "100"}, Timeout: 300 * time.Millisecond}, nil)
	if !e.TimedOut || e.Signal != int(syscall.SIGKILL) || time.Since(start) > 10*time.Second {
		t.Fatalf("timeout: %+v after %v", e, time.Since(start))
	}
}

func TestExecPTY(t *testing.T) {
	a := startAgent(t)
	out, _, e := run(t, a.c, client.ExecRequest{Args: []string{"tty"}, TTY: true, Rows: 24, Cols: 80}, nil)
	if !regexp.MustCompile(`^/dev/pts/\d+\r?\n$`).MatchString(out) || e.Code != 0 {
		t.Fatalf("tty = %q, %+v; want a /dev/pts path", out, e)
	}
	// A resize reaches the child (SIGWINCH, new size).
	resize := make(chan wire.Resize, 1)
	pr, pw := io.Pipe()
	var got bytes.Buffer
	read := make(chan struct{})
	go func() {
		defer close(read)
		br := bufio.NewReader(pr)
		for {
			l, err := br.ReadString('\n')
			got.WriteString(l)
			if strings.Contains(l, "ready") {
				resize <- wire.Resize{Rows: 40, Cols: 100}
			}
			if err != nil {
				return
			}
		}
	}()
	script := `trap 'stty size; exit 0' WINCH; echo ready; while :; do sleep 0.05; done`
	e, err := a.c.Exec(ctxT(t, 20*time.Second), client.ExecRequest{Args: []string{"sh", "-c", script}, TTY: true, Rows: 24, Cols: 80},
		client.Streams{Stdout: pw, Resize: resize})
	pw.Close()
	<-read // got is the reader's until it returns
	if err != nil || e.Code != 0 || !strings.Contains(got.String(), "40 100") {
		t.Fatalf("resize: %+v, %v, output %q; want \"40 100\"", e, err, got.String())
	}
}

// TestExecPTYEndsWhileSlaveHeld: a process that left the exec's group
// (setsid) keeps the PTY's slave open, so the master reports no hangup and
// a read never fails with EIO, as under gVisor always. The exec still ends
// with its command, well before the output grace, with its output.
func TestExecPTYEndsWhileSlaveHeld(t *testing.T) {
	a := startAgent(t)
	start := time.Now()
	// The shell waits until the sleep is in a session of its own (field 6
	// of its stat): before that the group kill would still reach it.
	script := `setsid sleep 20 & p=$!; while [ "$(cut -d' ' -f6 /proc/$p/stat)" = "$$" ]; do :; done; echo $p; echo done; exit 7`
	out, _, e := run(t, a.c, client.ExecRequest{Args: []string{"sh", "-c", script}, TTY: true}, nil)
	took := time.Since(start)
	if f := strings.Fields(out); len(f) > 0 {
		if pid, err := strconv.Atoi(f[0]); err == nil {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if !strings.HasSuffix(out, "done\r\n") || e.Code != 7 || took > time.Second {
		t.Fatalf("PTY exec with the slave still held: %q, %+v after %v; want done, exit 7, under 1s", out, e, took)
	}
}

// A caller that goes away mid-command leaves no process behind.
func TestExecCallerGoneKillsGroup(t *testing.T) {
	a := startAgent(t)
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	pids := make(chan []int, 1)
	go func() {
		l, _ := bufio.NewReader(pr).ReadString('\n')
		var ps []int
		for _, f := range strings.Fields(l) {
			n, _ := strconv.Atoi(f)
			ps = append(ps, n)
		}
		pids <- ps
		io.Copy(io.Discard, pr)
	}()
	done := make(chan error, 1)
	go func() {
		_, err := a.c.Exec(ctx, client.ExecRequest{Args: []string{"sh", "-c", "sleep 1000 & echo $$ $!; wait"}}, client.Streams{Stdout: pw})
		done <- err
	}()
	ps := <-pids
	if len(ps) != 2 {
		t.Fatalf("pids %v", ps)
	}
	for _, p := range ps {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", p)); err != nil {
			t.Fatalf("pid %d not running before the cancel: %v", p, err)
		}
	}
	cancel()
	if err := <-done; err == nil {
		t.Fatal("cancelled exec returned no error")
	}
	pw.Close()
	deadline := time.Now().Add(10 * time.Second)
	for _, p := range ps {
		for {
			_, err := os.Stat(fmt.Sprintf("/proc/%d", p))
			if errors.Is(err, os.ErrNotExist) {
				break
			}
			if time.Now().After(deadline) {
				st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
				t.Fatalf("pid %d still exists after the caller left: %s", p, st)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// patternReader yields n deterministic bytes without holding them.
type patternReader struct{ n, off int64 }

func (r *patternReader) Read(p []byte) (int, error) {
	if r.off >= r.n {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), r.n-r.off)]
	for i := range p {
		x := r.off + int64(i)
		p[i] = byte(x ^ x>>8 ^ x>>16)
	}
	r.off += int64(len(p))
	return len(p), nil
}

func TestFilesStreamed(t *testing.T) {
	a := startAgent(t, "--file-cap", strconv.Itoa(256<<20))
	dir := t.TempDir()
	p := filepath.Join(dir, "big")
	// Not a whole number of frames or of the agent's reads (fileChunk).
	const size = 200<<20 + 12345
	h := sha256.New()
	n, err := a.c.WriteFile(ctxT(t, 2*time.Minute), p, nil, 0o600, 0, io.TeeReader(&patternReader{n: size}, h))
	if err != nil || n != size {
		t.Fatalf("write %d: %v", n, err)
	}
	want := h.Sum(nil)
	h2 := sha256.New()
	n, err = a.c.ReadFile(ctxT(t, 2*time.Minute), p, nil, 0, h2)
	if err != nil || n != size || !bytes.Equal(h2.Sum(nil), want) {
		t.Fatalf("read back %d bytes, %v; same content %v", n, err, bytes.Equal(h2.Sum(nil), want))
	}
	// The agent never held the file: its peak RSS stays far below it.
	st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", a.cmd.Process.Pid))
	if m := regexp.MustCompile(`VmHWM:\s+(\d+) kB`).FindSubmatch(st); m != nil {
		kb, _ := strconv.Atoi(string(m[1]))
		t.Logf("agent peak RSS %d KiB after moving %d MiB both ways", kb, size>>20)
		if kb > 64<<10 {
			t.Fatalf("agent peak RSS %d KiB: the file was buffered", kb)
		}
	}
}

func TestFilesCapRefused(t *testing.T) {
	a := startAgent(t, "--file-cap", strconv.Itoa(1<<20))
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := a.c.WriteFile(ctxT(t, 30*time.Second), p, nil, 0o644, 0, &patternReader{n: 2 << 20})
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != wire.CodeTooLarge {
		t.Fatalf("write over the cap: %v; want too_large", err)
	}
	if b, _ := os.ReadFile(p); string(b) != "old" {
		t.Fatalf("a refused write replaced the file: %q", b)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("a refused write left files: %v", ents)
	}
	big := filepath.Join(dir, "big")
	os.WriteFile(big, make([]byte, 2<<20), 0o644)
	_, err = a.c.ReadFile(ctxT(t, 30*time.Second), big, nil, 0, io.Discard)
	if !errors.As(err, &we) || we.Code != wire.CodeTooLarge {
		t.Fatalf("read over the cap: %v; want too_large", err)
	}
	// The caller's own limit is enforced on its side too.
	_, err = a.c.ReadFile(ctxT(t, 30*time.Second), big, nil, 1000, io.Discard)
	if err == nil {
		t.Fatal("read over the caller's limit succeeded")
	}
	// Not a regular file.
	_, err = a.c.ReadFile(ctxT(t, 30*time.Second), dir, nil, 0, io.Discard)
	if !errors.As(err, &we) || we.Code != wire.CodeInvalid {
		t.Fatalf("read of a directory: %v; want invalid", err)
	}
}

func TestFileOps(t *testing.T) {
	a := startAgent(t)
	ctx := ctxT(t, 30*time.Second)
	dir := t.TempDir()
	d := filepath.Join(dir, "a/b")
	if err := a.c.Mkdir(ctx, d, 0o750, true, nil); err != nil {
		t.Fatal(err)
	}
	st, err := a.c.Stat(ctx, d, nil)
	if err != nil || st.Name != "b" || os.FileMode(st.Mode)&os.ModeDir == 0 || os.FileMode(st.Mode).Perm() != 0o750 {
		t.Fatalf("stat = %+v, %v", st, err)
	}
	if _, err := a.c.WriteFile(ctx, filepath.Join(d, "x"), nil, 0o644, 0, strings.NewReader("xyz")); err != nil {
		t.Fatal(err)
	}
	if err := a.c.Rename(ctx, filepath.Join(d, "x"), filepath.Join(d, "y"), nil); err != nil {
		t.Fatal(err)
	}
	for i := range 700 { // more than one frame of entries
		os.WriteFile(filepath.Join(d, fmt.Sprintf("f%03d-%s", i, strings.Repeat("n", 150))), nil, 0o644)
	}
	list, err := a.c.List(ctx, d, nil)
	if err != nil || len(list) != 701 {
		t.Fatalf("list: %d entries, %v", len(list), err)
	}
	var we *wire.Error
	if _, err := a.c.Stat(ctx, filepath.Join(d, "x"), nil); !errors.As(err, &we) || we.Code != wire.CodeNotFound {
		t.Fatalf("stat of a renamed file: %v", err)
	}
	if err := a.c.Remove(ctx, filepath.Join(dir, "a"), false, nil); err == nil {
		t.Fatal("non-recursive remove of a full dir succeeded")
	}
	if err := a.c.Remove(ctx, filepath.Join(dir, "a"), true, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "a")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("removed tree still there: %v", err)
	}
}

// Calls run concurrently on one agent.
func TestConcurrentCalls(t *testing.T) {
	a := startAgent(t)
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out bytes.Buffer
			e, err := a.c.Exec(ctxT(t, 30*time.Second), client.ExecRequest{Args: []string{"echo", strconv.Itoa(i)}}, client.Streams{Stdout: &out})
			if err != nil || e.Code != 0 || strings.TrimSpace(out.String()) != strconv.Itoa(i) {
				errs <- fmt.Errorf("call %d: %q %+v %v", i, out.String(), e, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// A process that left the command's group and holds its output does not
// keep the call open: the exit comes after a bounded grace.
func TestExecEscapedHolderDoesNotHangCall(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("no setsid binary")
	}
	a := startAgent(t)
	start := time.Now()
	// Not a group leader, setsid(1) calls setsid(2) and execs sleep in
	// the same pid: $! is the escaped process.
	out, _, e := run(t, a.c, client.ExecRequest{Args: []string{"sh", "-c", "setsid sleep 30 & echo $!"}}, nil)
	pid, err := strconv.Atoi(strings.TrimSpace(out))
	if err == nil && pid > 1 {
		t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	}
	if e.Code != 0 || err != nil || time.Since(start) > 10*time.Second {
		t.Fatalf("exit %+v, %q after %v", e, out, time.Since(start))
	}
}

// TestWorkloadThatCannotStartNeverAnswers: the agent listens while its
// workload starts, but `ready` waits for that start: a workload that
// cannot start ends the agent (exit 127, the workload named on stderr)
// and no ready call ever gets the nonce, so the host's readiness proof
// fails for it; the socket goes with the agent.
func TestWorkloadThatCannotStartNeverAnswers(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "agent.sock")
	cmd := exec.Command(os.Args[0], "--socket", sock, "--nonce-file", writeNonce(t, dir, "nonce-123"), "--", "/nonexistent/workload")
	cmd.Env = agentEnv()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// Ask as the host does, until the agent is gone.
	c := &client.Client{Socket: sock}
	var err error
	for done := false; !done; {
		select {
		case err = <-exited:
			done = true
		default:
		}
		if n, rerr := c.Ready(ctxT(t, 10*time.Second)); rerr == nil {
			t.Fatalf("ready answered %q although the workload never started", n)
		} else if we := (*wire.Error)(nil); errors.As(rerr, &we) && (we.Code != wire.CodeNotStarted || !strings.Contains(we.Message, "/nonexistent/workload")) {
			t.Errorf("ready refused with %v; want %s naming the workload", rerr, wire.CodeNotStarted)
		}
		time.Sleep(time.Millisecond)
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 127 {
		t.Fatalf("agent with a missing workload: %v, want exit 127; stderr %q", err, stderr.String())
	}
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket %s left behind by an agent whose workload never started: %v", sock, err)
	}
	if !strings.Contains(stderr.String(), "/nonexistent/workload") {
		t.Errorf("stderr %q does not name the workload", stderr.String())
	}
}

// TestNonceOnlyFromItsFile: the agent refuses a nonce in its environment
// (every guest user could read it in /proc/1/environ) and a missing,
// empty or oversized nonce file; the file is removed once read.
func TestNonceOnlyFromItsFile(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name  string
		nonce []byte // nil: no file
		env   string
	}{
		{"nonce in env", []byte("n"), agent.EnvNonce + "=nonce-123"},
		{"no file", nil, ""},
		{"empty file", []byte{}, ""},
		{"oversized file", bytes.Repeat([]byte("n"), agent.MaxNonce+1), ""},
	} {
		p := filepath.Join(dir, "nonce")
		os.Remove(p)
		if tc.nonce != nil {
			if err := os.WriteFile(p, tc.nonce, 0o400); err != nil {
				t.Fatal(err)
			}
		}
		cmd := exec.Command(os.Args[0], "--socket", filepath.Join(dir, "agent.sock"), "--nonce-file", p)
		cmd.Env = agentEnv()
		if tc.env != "" {
			cmd.Env = append(cmd.Env, tc.env)
		}
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Errorf("%s: %v, %q; want exit 2", tc.name, err, out)
		}
		if _, err := os.Lstat(filepath.Join(dir, "agent.sock")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: the agent made its socket: %v", tc.name, err)
		}
	}
	// A good file is read and removed.
	a := startAgent(t)
	if _, err := os.Lstat(filepath.Join(filepath.Dir(a.socket), "nonce")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("nonce file kept: %v", err)
	}
}

// TestFilesRefuseSpecialFiles: read and write refuse a FIFO, a socket and
// a directory, naming the kind, without hanging and without replacing
// them; a write through a symlink replaces the file it names and keeps
// the link.
func TestFilesRefuseSpecialFiles(t *testing.T) {
	a := startAgent(t)
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o666); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(dir, "sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for p, kind := range map[string]string{fifo: "FIFO", filepath.Join(dir, "sock"): "socket", dir: "directory"} {
		ctx := ctxT(t, 10*time.Second)
		_, rerr := a.c.ReadFile(ctx, p, nil, 0, io.Discard)
		_, werr := a.c.WriteFile(ctx, p, nil, 0o644, 0, strings.NewReader("x"))
		for verb, err := range map[string]error{"read": rerr, "write": werr} {
			var we *wire.Error
			if !errors.As(err, &we) || we.Code != wire.CodeInvalid || !strings.Contains(we.Message, "not a regular file ("+kind+")") {
				t.Errorf("%s %s: %v, want invalid: not a regular file (%s)", verb, p, err, kind)
			}
		}
	}
	if fi, err := os.Lstat(fifo); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		t.Errorf("the FIFO was replaced: %v %v", fi, err)
	}
	real, link := filepath.Join(dir, "real"), filepath.Join(dir, "link")
	if err := os.WriteFile(real, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("real", link); err != nil {
		t.Fatal(err)
	}
	if _, err := a.c.WriteFile(ctxT(t, 10*time.Second), link, nil, 0o644, 0, strings.NewReader("new")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(real); string(b) != "new" {
		t.Errorf("through the symlink: %q, want new", b)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("the symlink was replaced: %v %v", fi, err)
	}
}

// TestExecJobControlLeavesNoProcess: a shell with job control (an
// interactive shell on the PTY, `set -m`) puts a background job in a
// process group of its own, which a group kill misses. The exec's session
// is killed too: when the command ends and when the caller goes away.
func TestExecJobControlLeavesNoProcess(t *testing.T) {
	a := startAgent(t)
	script := `set -m; sleep 1000 & echo job $(cut -d' ' -f5,6 /proc/$!/stat) $! $$`
	out, _, e := run(t, a.c, client.ExecRequest{Args: []string{"sh", "-c", script}, TTY: true}, nil)
	// "job <pgrp> <session> <job pid> <shell pid>"
	f := strings.Fields(out)
	if len(f) != 5 || f[0] != "job" || e.Code != 0 {
		t.Fatalf("out %q, %+v", out, e)
	}
	job, _ := strconv.Atoi(f[3])
	if f[1] != f[3] || f[2] != f[4] {
		t.Fatalf("job %s: group %s, session %s (shell %s); want a group of its own in the shell's session", f[3], f[1], f[2], f[4])
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", job))
		if errors.Is(err, os.ErrNotExist) || strings.Contains(string(st), ") Z ") {
			break
		}
		if time.Now().After(deadline) {
			syscall.Kill(job, syscall.SIGKILL)
			t.Fatalf("background job %d still runs after its exec ended: %s", job, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestColdAgentBootReport: once its workload started, a cold agent leaves
// where its boot went beside its socket: each step measured, none
// negative, the runtime's start-up within reason.
func TestColdAgentBootReport(t *testing.T) {
	a := startAgent(t, "--", "sleep", "1000")
	if got, err := a.c.Ready(ctxT(t, 30*time.Second)); err != nil || got != "nonce-123" {
		t.Fatalf("ready = %q, %v", got, err)
	}
	path := filepath.Join(filepath.Dir(a.socket), wire.BootReportName)
	var b []byte
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var err error
		if b, err = os.ReadFile(path); err == nil || time.Now().After(deadline) {
			break
		}
	}
	var r wire.BootReport
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("boot report %q: %v", b, err)
	}
	if r.ListenMS <= 0 || r.StartMS <= 0 || r.RuntimeMS < 0 || r.RuntimeMS > 60_000 {
		t.Fatalf("boot report %+v: want listen and start measured, the runtime's start-up within a minute", r)
	}
	t.Logf("boot report on the host: %+v", r)
}
