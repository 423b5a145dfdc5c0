package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/snippet"
)

// TestCLICode: code runs the source from -c, -f FILE and -f - through the
// fake node's interpreters (each line one of its commands), streams stdin
// with -i, exits with the snippet's code (124 past its timeout) and
// leaves nothing in the guest's /tmp.
func TestCLICode(t *testing.T) {
	e := newEnv(t)
	e.ok("sandbox", "create", "sb1")
	if r := e.run("", "code", "sb1", "-l", "python", "-c", "echo hello\nfail 3 Traceback"); r.code != 3 || r.stdout != "hello\n" || r.stderr != "Traceback\n" {
		t.Errorf("code -c: %+v", r)
	}
	src := filepath.Join(t.TempDir(), "main.py")
	if err := os.WriteFile(src, []byte("cat\nid\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := e.run("from stdin\n", "sandbox", "code", "-i", "--user", "7", "sb1", "--language", "python", "-f", src); r.code != 0 || r.stdout != "from stdin\nuid=7 gid=7\n" {
		t.Errorf("code -f FILE -i: %+v", r)
	}
	if r := e.run("echo piped", "code", "sb1", "-l", "sh", "-f", "-"); r.code != 0 || r.stdout != "piped\n" {
		t.Errorf("code -f -: %+v", r)
	}
	if r := e.run("", "code", "sb1", "-l", "sh", "--exec-timeout", "1", "-c", "sleep 30"); r.code != exitTimedOut {
		t.Errorf("code past its timeout: %+v, want exit %d", r, exitTimedOut)
	}
	if out := e.ok("sandbox", "file", "ls", "sb1", "/tmp"); strings.Contains(out, "ctl-code") {
		t.Errorf("the runs left their directories in /tmp:\n%s", out)
	}
	for _, c := range []struct {
		stdin string
		args  []string
		want  string
	}{
		{"", []string{"code", "sb1", "-l", "cobol", "-c", "x"}, `unknown language "cobol"`},
		{"", []string{"code", "sb1", "-l", "sh"}, "one of -f FILE"},
		{"", []string{"code", "sb1", "-l", "sh", "-c", "x", "-f", src}, "one of -f FILE"},
		{"x", []string{"code", "sb1", "-l", "sh", "-i", "-f", "-"}, "cannot be the snippet's stdin"},
		{strings.Repeat("x", snippet.MaxSourceBytes+1), []string{"code", "sb1", "-l", "sh", "-f", "-"}, "larger than 262144"},
	} {
		if r := e.run(c.stdin, c.args...); r.code != exitUsage || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%q: %+v, want usage error with %q", c.args, r, c.want)
		}
	}
	if r := e.run("", "code", "nope", "-l", "sh", "-c", "true"); r.code != exitFailed || !strings.Contains(r.stderr, "code in sandbox nope: not_found") {
		t.Errorf("code in a missing sandbox: %+v", r)
	}
}

func TestParseTemplatesLanguages(t *testing.T) {
	got, err := parseTemplates([]string{"busybox:overlay:sh", "py:block:python,sh", "plain"})
	if err != nil || len(got) != 3 || strings.Join(got[1].Languages, ",") != "python,sh" || got[1].Mode != "block" || got[2].Languages != nil || got[2].Mode != "overlay" {
		t.Fatalf("parseTemplates = %+v, %v", got, err)
	}
	if _, err := parseTemplates([]string{"py:block:python,perl"}); err == nil || !strings.Contains(err.Error(), `unknown language "perl"`) {
		t.Fatalf("perl: %v", err)
	}
}
