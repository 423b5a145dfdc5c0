package snippet

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
)

func TestNewPlan(t *testing.T) {
	u := &api.User{UID: 1000, GID: 1000}
	p, err := NewPlan(Request{Language: "python", Source: []byte("print(1)"), Stdin: []byte("x"), Env: []string{"A=1"}, TimeoutSec: 5, User: u}, "/tmp", "ab12")
	if err != nil {
		t.Fatal(err)
	}
	want := Plan{Dir: "/tmp/.ctl-code-ab12", File: "/tmp/.ctl-code-ab12/main.py",
		Exec: api.ExecRequest{Args: []string{"python3", "/tmp/.ctl-code-ab12/main.py"}, Env: []string{"A=1"}, Stdin: []byte("x"), TimeoutSec: 5, User: u}}
	if fmt.Sprint(p) != fmt.Sprint(want) {
		t.Fatalf("plan = %+v\nwant %+v", p, want)
	}
	for _, l := range Languages() {
		p, err := NewPlan(Request{Language: l.Name, Source: []byte("x"), Stdin: []byte("in")}, "/tmp", "t")
		if err != nil || p.Exec.Args[0] != l.Interpreter[0] || !strings.HasSuffix(p.File, l.File) || string(p.Exec.Stdin) != "in" {
			t.Errorf("%s: plan %+v, %v", l.Name, p, err)
		}
	}
	// No stdin of the caller's: python and node take the source on stdin
	// (one exec); a shell would read its own script with `read`: a file.
	for lang, want := range map[string][]string{"python": {"python3", "-"}, "node": {"node", "-"}, "sh": {"sh", "/tmp/.ctl-code-t/main.sh"}, "bash": {"bash", "/tmp/.ctl-code-t/main.sh"}} {
		p, err := NewPlan(Request{Language: lang, Source: []byte("src")}, "/tmp", "t")
		stdin := ""
		if want[1] == "-" {
			stdin = "src"
		}
		if err != nil || !slices.Equal(p.Exec.Args, want) || string(p.Exec.Stdin) != stdin || (p.Dir == "") != (want[1] == "-") {
			t.Errorf("%s without stdin: plan %+v, %v", lang, p, err)
		}
	}
	// A caller that streams stdin itself keeps it: the source goes in a file.
	if p, err := NewPlan(Request{Language: "python", Source: []byte("x"), StreamsStdin: true}, "/tmp", "t"); err != nil || p.File != "/tmp/.ctl-code-t/main.py" || p.Exec.Stdin != nil {
		t.Errorf("python with a streamed stdin: %+v, %v", p, err)
	}
	// The source never reaches the command line, whatever it holds.
	hostile := "'; rm -rf / #\n$(reboot)"
	p, err = NewPlan(Request{Language: "sh", Source: []byte(hostile)}, "/tmp", "t")
	if err != nil || slices.ContainsFunc(p.Exec.Args, func(a string) bool { return strings.Contains(a, "rm -rf") }) {
		t.Fatalf("hostile source: %+v, %v", p, err)
	}

	bad := []struct {
		name string
		req  Request
		want string
	}{
		{"unknown language", Request{Language: "cobol", Source: []byte("x")}, "unknown language \"cobol\": one of bash, node, python, sh"},
		{"no language", Request{Source: []byte("x")}, "unknown language"},
		{"too large", Request{Language: "sh", Source: make([]byte, MaxSourceBytes+1)}, "at most 262144"},
		{"NUL", Request{Language: "sh", Source: []byte("a\x00b")}, "NUL"},
		{"bad timeout", Request{Language: "sh", TimeoutSec: -1}, "timeout_sec"},
		{"bad env", Request{Language: "sh", Env: []string{"NOEQUALS"}}, "env"},
	}
	for _, c := range bad {
		_, err := NewPlan(c.req, "/tmp", "t")
		if err == nil || !strings.Contains(err.Error(), c.want) || errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
			t.Errorf("%s: err %v (code %s), want invalid_argument with %q", c.name, err, errdefs.CodeOf(err), c.want)
		}
	}
}

func TestCheckServed(t *testing.T) {
	if err := CheckServed("python", "py", []string{"python", "sh"}); err != nil {
		t.Fatal(err)
	}
	err := CheckServed("node", "py", []string{"python", "sh"})
	if errdefs.CodeOf(err) != errdefs.CodeInvalidArgument || !strings.Contains(err.Error(), `template "py" serves python, sh, not node`) {
		t.Fatalf("node on py: %v", err)
	}
	if err := CheckServed("sh", "plain", nil); err == nil || !strings.Contains(err.Error(), "serves no language") {
		t.Fatalf("sh on a template with none: %v", err)
	}
}

// guest records the calls of a run as text; fail names a call to fail.
type guest struct {
	calls []string
	fail  string
	files map[string]string
}

func (g *guest) step(s string) error {
	g.calls = append(g.calls, s)
	if g.fail != "" && strings.HasPrefix(s, g.fail) {
		return errdefs.Errorf(errdefs.CodeUnavailable, "%s failed", g.fail)
	}
	return nil
}

func (g *guest) MakeDir(_ context.Context, id, p string, mode uint32, parents bool, u *api.User) error {
	return g.step(fmt.Sprintf("mkdir %s %s %o parents=%v user=%v", id, p, mode, parents, u))
}

func (g *guest) WriteFileFrom(_ context.Context, id, p string, u *api.User, mode uint32, r io.Reader, size int64) error {
	b, _ := io.ReadAll(r)
	if err := g.step(fmt.Sprintf("write %s %s %o size=%d user=%v", id, p, mode, size, u)); err != nil {
		return err
	}
	g.files[p] = string(b)
	return nil
}

func (g *guest) Exec(_ context.Context, id string, req api.ExecRequest, stdout, _ io.Writer) (int, error) {
	if err := g.step(fmt.Sprintf("exec %s %q", id, req.Args)); err != nil {
		return -1, err
	}
	io.WriteString(stdout, g.files[req.Args[1]])
	return 7, nil
}

func (g *guest) RemoveFile(_ context.Context, id, p string, recursive bool, u *api.User) error {
	return g.step(fmt.Sprintf("rm %s %s recursive=%v user=%v", id, p, recursive, u))
}

func TestRun(t *testing.T) {
	tok := func() (string, error) { return "tok", nil }
	req := Request{Language: "python", Source: []byte("print('hi')"), Stdin: []byte("in")}
	cases := []struct {
		fail     string
		code     int
		wantErr  bool
		wantCall []string
	}{
		{"", 7, false, []string{
			"mkdir sb /tmp/.ctl-code-tok 700 parents=false user=<nil>",
			"write sb /tmp/.ctl-code-tok/main.py 600 size=11 user=<nil>",
			`exec sb ["python3" "/tmp/.ctl-code-tok/main.py"]`,
			"rm sb /tmp/.ctl-code-tok recursive=true user=<nil>",
		}},
		// A mkdir that failed made nothing: nothing to remove.
		{"mkdir", -1, true, []string{"mkdir sb /tmp/.ctl-code-tok 700 parents=false user=<nil>"}},
		{"write", -1, true, []string{
			"mkdir sb /tmp/.ctl-code-tok 700 parents=false user=<nil>",
			"write sb /tmp/.ctl-code-tok/main.py 600 size=11 user=<nil>",
			"rm sb /tmp/.ctl-code-tok recursive=true user=<nil>",
		}},
		{"exec", -1, true, []string{
			"mkdir sb /tmp/.ctl-code-tok 700 parents=false user=<nil>",
			"write sb /tmp/.ctl-code-tok/main.py 600 size=11 user=<nil>",
			`exec sb ["python3" "/tmp/.ctl-code-tok/main.py"]`,
			"rm sb /tmp/.ctl-code-tok recursive=true user=<nil>",
		}},
		// A failed removal is logged: the run's answer stands.
		{"rm", 7, false, []string{
			"mkdir sb /tmp/.ctl-code-tok 700 parents=false user=<nil>",
			"write sb /tmp/.ctl-code-tok/main.py 600 size=11 user=<nil>",
			`exec sb ["python3" "/tmp/.ctl-code-tok/main.py"]`,
			"rm sb /tmp/.ctl-code-tok recursive=true user=<nil>",
		}},
	}
	for _, c := range cases {
		g := &guest{fail: c.fail, files: map[string]string{}}
		var out bytes.Buffer
		code, err := Runner{Guest: g, Token: tok}.Run(context.Background(), "sb", req, &out, io.Discard)
		if code != c.code || (err != nil) != c.wantErr || !slices.Equal(g.calls, c.wantCall) {
			t.Errorf("fail %q: code %d err %v calls\n%s\nwant code %d calls\n%s", c.fail, code, err, strings.Join(g.calls, "\n"), c.code, strings.Join(c.wantCall, "\n"))
		}
		if c.fail == "" && out.String() != "print('hi')" {
			t.Errorf("the interpreter's file held %q", out.String())
		}
	}
	// Python without stdin: one exec, the source its stdin.
	g := &guest{files: map[string]string{"-": "unused"}}
	if code, err := (Runner{Guest: g, Token: tok}).Run(context.Background(), "sb", Request{Language: "python", Source: []byte("print(1)")}, io.Discard, io.Discard); err != nil || code != 7 ||
		!slices.Equal(g.calls, []string{`exec sb ["python3" "-"]`}) {
		t.Fatalf("python without stdin: %d, %v, calls %q", code, err, g.calls)
	}
	// An unknown language makes no call at all.
	g = &guest{files: map[string]string{}}
	if _, err := (Runner{Guest: g}).Run(context.Background(), "sb", Request{Language: "perl"}, io.Discard, io.Discard); err == nil || len(g.calls) != 0 {
		t.Fatalf("perl: %v, calls %q", err, g.calls)
	}
	// Two runs never share a directory.
	g = &guest{files: map[string]string{}}
	r := Runner{Guest: g}
	for range 2 {
		if _, err := r.Run(context.Background(), "sb", req, io.Discard, io.Discard); err != nil {
			t.Fatal(err)
		}
	}
	if g.calls[0] == g.calls[4] {
		t.Fatalf("two runs made the same directory: %q", g.calls)
	}
}
