package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/testutil"
)

// ordered records the writes of two streams in the order they came.
type ordered struct {
	mu  sync.Mutex
	log []string
}

func (o *ordered) stream(tag string) io.Writer {
	return writerFunc(func(p []byte) (int, error) {
		o.mu.Lock()
		defer o.mu.Unlock()
		for _, l := range strings.SplitAfter(string(p), "\n") {
			if l != "" {
				o.log = append(o.log, tag+":"+strings.TrimSpace(l))
			}
		}
		return len(p), nil
	})
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func waitOutput(t *testing.T, b *testutil.Buffer, want string, d time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(d); !strings.Contains(b.String(), want); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the session's output after %v:\n%s", want, d, b.String())
		}
	}
}

// sessionGuest starts a node and claims sandbox "sess" (its workload as
// uid 1000); on failure the test logs the guest's own log (the agent's).
func sessionGuest(t *testing.T) (*env, *api.Client) {
	e := newEnv(t)
	e.start("a")
	e.waitPrimary("a", 2*time.Minute)
	c := e.client()
	req := claimReq("c1", 1)
	req.Process = api.Process{UID: 1000, GID: 1000}
	if _, err := c.Claim(ctx(t, 3*time.Minute), "sess", req); err != nil {
		t.Fatalf("claim: %v", err)
	}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, src := range []api.LogSource{"", api.LogSourceRunsc} {
			var b bytes.Buffer
			_, err := c.Logs(ctx(t, time.Minute), "sess", api.LogsRequest{Source: src, Tail: 200}, &b)
			t.Logf("guest log (source %q, last 200 lines, %v):\n%s", src, err, b.String())
		}
	})
	return e, c
}

// TestSessionsThroughTheAgent drives sessions of the real API against a
// real guest: stdout and stderr in the order written, stdin, exit codes, a
// signal, ctl-manager's exec -i, and PTY sessions (through the API and
// ctl-manager's exec -t) that end with their command.
func TestSessionsThroughTheAgent(t *testing.T) {
	e, c := sessionGuest(t)

	t.Run("order, stdin, exit", func(t *testing.T) {
		var o ordered
		x, err := c.Session(ctx(t, 2*time.Minute), "sess", api.ExecRequest{Args: []string{"/bin/sh", "-c", "echo out1; sleep 0.3; echo err1 >&2; sleep 0.3; echo out2; read line; echo got $line; exit 3"}},
			api.Streams{Stdin: strings.NewReader("hello\n"), Stdout: o.stream("out"), Stderr: o.stream("err")})
		if err != nil || x != (api.ExecExit{ExitCode: 3}) {
			t.Errorf("session: %+v %v, want exit 3", x, err)
		}
		if got, want := strings.Join(o.log, " "), "out:out1 err:err1 out:out2 out:got hello"; got != want {
			t.Errorf("output %q, want %q", got, want)
		}
	})

	t.Run("signal", func(t *testing.T) {
		var out testutil.Buffer
		sig := make(chan int, 1)
		type end struct {
			x   api.ExecExit
			err error
		}
		ended := make(chan end, 1)
		go func() {
			x, err := c.Session(ctx(t, 2*time.Minute), "sess", api.ExecRequest{Args: []string{"/bin/sh", "-c", "echo ready; exec sleep 4241"}},
				api.Streams{Stdout: &out, Signal: sig})
			ended <- end{x, err}
		}()
		waitOutput(t, &out, "ready", time.Minute)
		sig <- 15
		select {
		case r := <-ended:
			if r.err != nil || r.x.Signal != 15 || r.x.ExitCode != -1 {
				t.Errorf("sleep after SIGTERM: %+v %v, want killed by 15", r.x, r.err)
			}
		case <-time.After(time.Minute):
			t.Fatal("the signal did not end the command")
		}
	})

	// gVisor's PTY master never reports a hangup: a session on a PTY ends
	// because its command ended, within ptyEnd.
	const ptyEnd = time.Minute
	t.Run("pty", func(t *testing.T) {
		var out testutil.Buffer
		resize := make(chan api.TermSize, 1)
		type end struct {
			x   api.ExecExit
			err error
		}
		ended := make(chan end, 1)
		script := `tty; id -u; stty size; echo ready; while [ "$(stty size)" = "24 80" ]; do sleep 0.1; done; stty size; exit 3`
		go func() {
			x, err := c.Session(ctx(t, 3*time.Minute), "sess", api.ExecRequest{Args: []string{"/bin/sh", "-c", script}, TTY: true, Rows: 24, Cols: 80},
				api.Streams{Stdout: &out, Resize: resize})
			ended <- end{x, err}
		}()
		waitOutput(t, &out, "ready", time.Minute)
		resized := time.Now()
		resize <- api.TermSize{Rows: 40, Cols: 100}
		select {
		case r := <-ended:
			t.Logf("PTY session ended %v after the resize: %+v %v", time.Since(resized).Round(time.Millisecond), r.x, r.err)
			if r.err != nil || r.x != (api.ExecExit{ExitCode: 3}) {
				t.Errorf("PTY session: %+v %v, want exit 3", r.x, r.err)
			}
			// A terminal's output: \r\n line ends (ONLCR).
			if want := regexp.MustCompile(`^/dev/pts/\d+\r\n1000\r\n24 80\r\nready\r\n40 100\r\n$`); !want.MatchString(out.String()) {
				t.Errorf("PTY session output %q, want tty, uid 1000, 24 80, ready, 40 100", out.String())
			}
		case <-time.After(ptyEnd):
			t.Fatalf("the PTY session did not end within %v of the resize; output %q", ptyEnd, out.String())
		}
	})

	t.Run("cli pty", func(t *testing.T) {
		bin := filepath.Join(filepath.Dir(e.bin), "ctl-manager")
		cctx, cancel := context.WithTimeout(context.Background(), ptyEnd)
		defer cancel()
		// Not a terminal here: the CLI asks for its default 24x80.
		cmd := exec.CommandContext(cctx, bin, "--socket", filepath.Join(e.runDir, "ctld.sock"), "sandbox", "exec", "-t", "sess", "--", "/bin/sh", "-c", "tty; stty size; exit 4")
		out, err := cmd.Output()
		if cctx.Err() != nil {
			t.Fatalf("ctl-manager sandbox exec -t did not end within %v: %q", ptyEnd, out)
		}
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 4 || !regexp.MustCompile(`^/dev/pts/\d+\r\n24 80\r\n$`).Match(out) {
			t.Errorf("ctl-manager sandbox exec -t: %q %v, want tty, 24 80 and exit 4", out, err)
		}
	})

	t.Run("cli", func(t *testing.T) {
		bin := filepath.Join(filepath.Dir(e.bin), "ctl-manager")
		cmd := exec.Command(bin, "--socket", filepath.Join(e.runDir, "ctld.sock"), "sandbox", "exec", "-i", "sess", "--", "/bin/sh", "-c", "cat; exit 6")
		cmd.Stdin = strings.NewReader("piped through\n")
		out, err := cmd.Output()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 6 || string(out) != "piped through\n" {
			t.Errorf("ctl-manager sandbox exec -i: %q %v, want the stdin back and exit 6", out, err)
		}
	})
}

// vmHWM is the peak resident set of pid (VmHWM), in bytes.
func vmHWM(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "VmHWM:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}

// TestFileStreamed writes a file of CTLD_E2E_FILE_BYTES (default 64 MiB;
// the 1 GiB with CTLD_E2E_FILE_BYTES=1073741824 took 10.5 minutes
// of the TCG VM, with -mem 8192: too long for the e2e job) into a guest
// through the API
// and reads it back: byte-identical (compared with the pattern written;
// the guest's own sha256sum of sampled MiBs agrees with the pattern's),
// and ctld's peak RSS grows by far less than the file (it streams, it
// never holds the file).
func TestFileStreamed(t *testing.T) {
	size := int64(envInt("CTLD_E2E_FILE_BYTES", 64<<20))
	e := newEnv(t)
	e.start("a")
	e.waitPrimary("a", 2*time.Minute)
	c := e.client()
	req := claimReq("c1", 1)
	req.Resources.DiskBytes = size + 256<<20
	// The sentry keeps the file's pages in the guest's memory.
	req.Resources.MemoryBytes = max(req.Resources.MemoryBytes, size+256<<20)
	if _, err := c.Claim(ctx(t, 3*time.Minute), "big", req); err != nil {
		t.Fatalf("claim: %v", err)
	}
	pid := e.procs["a"].Process.Pid
	before := vmHWM(t, pid)

	start := time.Now()
	if err := c.WriteFileFrom(ctx(t, 20*time.Minute), "big", "/root/big", nil, 0o600, &ktest.Pattern{N: size}, size); err != nil {
		t.Fatalf("write %d bytes: %v", size, err)
	}
	wrote := time.Since(start)

	check := &ktest.PatternCheck{N: size}
	start = time.Now()
	n, err := c.ReadFileTo(ctx(t, 20*time.Minute), "big", "/root/big", nil, check)
	if err != nil || n != size {
		t.Fatalf("read back: %d bytes, %v", n, err)
	}
	read := time.Since(start)
	if err := check.Err(); err != nil {
		t.Fatalf("read back: %v", err)
	}
	// The guest's own view, not through the agent: the first, a middle
	// and the last MiB.
	const mib = 1 << 20
	for _, k := range []int64{0, (size / mib) / 2, (size - 1) / mib} {
		want := sha256.New()
		io.Copy(want, io.NewSectionReader(&ktest.Pattern{N: size}, k*mib, mib))
		sum := hex.EncodeToString(want.Sum(nil))
		script := fmt.Sprintf("dd if=/root/big bs=%d skip=%d count=1 2>/dev/null | sha256sum", mib, k)
		r, err := c.Exec(ctx(t, 5*time.Minute), "big", api.ExecRequest{Args: []string{"/bin/sh", "-c", script}})
		if err != nil || r.ExitCode != 0 || !strings.HasPrefix(string(r.Stdout), sum+" ") {
			t.Errorf("the guest's sha256sum of MiB %d: %+v %v, want %s", k, r, err, sum)
		}
	}
	after := vmHWM(t, pid)
	t.Logf("%d MiB: write %v (%.1f MiB/s), read %v (%.1f MiB/s); ctld VmHWM %d MiB before, %d MiB after",
		size>>20, wrote, float64(size)/wrote.Seconds()/(1<<20), read, float64(size)/read.Seconds()/(1<<20), before>>20, after>>20)
	// Half the file (at most 64 MiB): a server that held the file would
	// grow by all of it.
	if grew, bound := after-before, min(size/2, 64<<20); grew > bound {
		t.Errorf("ctld's peak RSS grew by %d MiB moving a %d MiB file (bound %d MiB): it is buffering", grew>>20, size>>20, bound>>20)
	}
}
