package servicetest

import (
	"bytes"
	"context"
	"io/fs"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/testutil"
)

// session runs a session to its end and returns its output.
func (s *subject) session(ctx context.Context, req api.ExecRequest, stdin string, signal chan int) (api.ExecExit, string, string, error) {
	var out, errOut testutil.Buffer
	x, err := s.s.Session(ctx, id, req, api.Streams{Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &errOut, Signal: signal})
	return x, out.String(), errOut.String(), err
}

// agentCases are the guest agent's calls (Option GuestAgent).
var agentCases = []struct {
	name  string
	needs Option
	run   func(t *testing.T, s *subject)
}{
	{"a session streams stdin to its command and reports its exit", GuestAgent, func(t *testing.T, s *subject) {
		s.ready()
		x, out, _, err := s.session(s.ctx, api.ExecRequest{Args: []string{"cat"}}, "hello\n", nil)
		if err != nil || x != (api.ExecExit{}) || out != "hello\n" {
			t.Errorf("cat: %+v %q %v, want exit 0 and the stdin", x, out, err)
		}
		for args, code := range map[string]int{"false": 1, "true": 0} {
			if x, _, _, err := s.session(s.ctx, api.ExecRequest{Args: []string{args}}, "", nil); err != nil || x.ExitCode != code {
				t.Errorf("%s: %+v %v, want exit %d", args, x, err, code)
			}
		}
		if x, _, _, err := s.session(s.ctx, api.ExecRequest{Args: []string{"sh", "-c", "exit 3"}}, "", nil); err != nil || x.ExitCode != 3 || x.Signal != 0 {
			t.Errorf("exit 3: %+v %v", x, err)
		}
		x, out, errOut, err := s.session(s.ctx, api.ExecRequest{Args: []string{"sh", "-c", "echo out; echo err >&2"}}, "", nil)
		if err != nil || x.ExitCode != 0 || out != "out\n" || errOut != "err\n" {
			t.Errorf("stdout and stderr: %+v %q %q %v", x, out, errOut, err)
		}
	}},
	{"a signal ends a session's command, reported as its death by it", GuestAgent, func(t *testing.T, s *subject) {
		s.ready()
		sig := make(chan int, 1)
		sig <- 15
		x, _, _, err := s.session(s.ctx, api.ExecRequest{Args: []string{"sleep", "100"}}, "", sig)
		if err != nil || x.ExitCode != -1 || x.Signal != 15 {
			t.Errorf("sleep killed by SIGTERM: %+v %v, want exit -1 signal 15", x, err)
		}
	}},
	{"a session with tty runs on a terminal, without it does not", GuestAgent, func(t *testing.T, s *subject) {
		s.ready()
		x, out, _, err := s.session(s.ctx, api.ExecRequest{Args: []string{"tty"}, TTY: true, Rows: 24, Cols: 80}, "", nil)
		if err != nil || x.ExitCode != 0 || !strings.HasPrefix(out, "/dev/pts/") {
			t.Errorf("tty on a PTY: %+v %q %v", x, out, err)
		}
		x, out, _, err = s.session(s.ctx, api.ExecRequest{Args: []string{"tty"}}, "", nil)
		if err != nil || x.ExitCode != 1 || !strings.Contains(out, "not a tty") {
			t.Errorf("tty without a PTY: %+v %q %v", x, out, err)
		}
	}},
	{"a session ends when its caller goes away", GuestAgent, func(t *testing.T, s *subject) {
		s.ready()
		ctx, cancel := context.WithTimeout(s.ctx, 500*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, _, _, err := s.session(ctx, api.ExecRequest{Args: []string{"sleep", "100"}}, "", nil)
		if err == nil || time.Since(start) > 10*time.Second {
			t.Errorf("session after its caller left: %v after %v, want an error at once", err, time.Since(start))
		}
	}},
	{"exec via runsc runs the command", GuestAgent, func(t *testing.T, s *subject) {
		s.ready()
		var out bytes.Buffer
		if code, err := s.s.ExecViaRunsc(s.ctx, id, api.ExecRequest{Args: []string{"echo", "hi"}}, &out, &out); err != nil || code != 0 || out.String() != "hi\n" {
			t.Errorf("echo hi via runsc: %d %q %v", code, out.String(), err)
		}
	}},
	{"file calls see the guest's files", GuestAgent, func(t *testing.T, s *subject) {
		s.ready()
		write := func(p, data string, mode uint32, limit int64) error {
			n, err := s.s.WriteFileFrom(s.ctx, id, p, nil, mode, limit, strings.NewReader(data))
			if err == nil && n != int64(len(data)) {
				t.Errorf("write %s: %d bytes written, want %d", p, n, len(data))
			}
			return err
		}
		read := func(p string, limit int64) (string, error) {
			var b bytes.Buffer
			_, err := s.s.ReadFileTo(s.ctx, id, p, nil, limit, &b)
			return b.String(), err
		}
		if err := write("/tmp/f", "data", 0o600, 1<<20); err != nil {
			t.Fatalf("write /tmp/f: %v", err)
		}
		if got, err := read("/tmp/f", 1<<20); err != nil || got != "data" {
			t.Errorf("read back: %q %v", got, err)
		}
		_, err := read("/tmp/f", 2)
		s.wantCode("read over its limit", err, errdefs.CodeInvalidArgument)
		s.wantCode("write over its limit", write("/tmp/f", "longer than four", 0, 4), errdefs.CodeInvalidArgument)
		if got, err := read("/tmp/f", 1<<20); err != nil || got != "data" {
			t.Errorf("after a refused write: %q %v, want the file unchanged", got, err)
		}
		fi, err := s.s.StatFile(s.ctx, id, "/tmp/f", nil)
		if err != nil || fi.Name != "f" || fi.Size != 4 || fs.FileMode(fi.Mode) != 0o600 {
			t.Errorf("stat /tmp/f: %+v %v, want f, 4 bytes, mode 0600", fi, err)
		}
		s.wantCode("mkdir without parents", s.s.MakeDir(s.ctx, id, "/tmp/d/e", 0, false, nil), errdefs.CodeNotFound)
		if err := s.s.MakeDir(s.ctx, id, "/tmp/d/e", 0o700, true, nil); err != nil {
			t.Fatalf("mkdir -p /tmp/d/e: %v", err)
		}
		if fi, err := s.s.StatFile(s.ctx, id, "/tmp/d/e", nil); err != nil || !fs.FileMode(fi.Mode).IsDir() || fs.FileMode(fi.Mode).Perm() != 0o700 {
			t.Errorf("stat /tmp/d/e: %+v %v, want a directory of mode 0700", fi, err)
		}
		if err := s.s.RenameFile(s.ctx, id, "/tmp/f", "/tmp/d/g", nil); err != nil {
			t.Fatalf("rename: %v", err)
		}
		_, err = s.s.StatFile(s.ctx, id, "/tmp/f", nil)
		s.wantCode("stat of the renamed file's old path", err, errdefs.CodeNotFound)
		es, err := s.s.ListDir(s.ctx, id, "/tmp/d", nil)
		names := []string{}
		for _, e := range es {
			names = append(names, e.Name)
		}
		// In the directory's order, which the contract leaves open (the
		// real agent lists as the guest's filesystem does).
		slices.Sort(names)
		if err != nil || !slices.Equal(names, []string{"e", "g"}) {
			t.Errorf("list /tmp/d: %q %v, want e and g", names, err)
		}
		s.wantCode("remove of a missing file", s.s.RemoveFile(s.ctx, id, "/tmp/nope", false, nil), errdefs.CodeNotFound)
		if err := s.s.RemoveFile(s.ctx, id, "/tmp/d", true, nil); err != nil {
			t.Fatalf("remove -r /tmp/d: %v", err)
		}
		_, err = s.s.ListDir(s.ctx, id, "/tmp/d", nil)
		s.wantCode("list of a removed directory", err, errdefs.CodeNotFound)
		_, err = read("/tmp/missing", 1<<20)
		s.wantCode("read of a missing file", err, errdefs.CodeNotFound)
		s.release(release("r1", 1))
		_, err = s.s.StatFile(s.ctx, id, "/tmp", nil)
		s.wantCode("stat in a released generation", err, errdefs.CodeConflict)
		_, _, _, err = s.session(s.ctx, api.ExecRequest{Args: []string{"true"}}, "", nil)
		s.wantCode("session in a released generation", err, errdefs.CodeConflict)
	}},
}
