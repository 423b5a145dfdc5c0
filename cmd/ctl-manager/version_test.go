package main

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestCLIVersion(t *testing.T) {
	e := newEnv(t)
	if r := e.run("", "version"); r.code != 0 || strings.TrimSpace(r.stdout) == "" || r.stderr != "" {
		t.Fatalf("version: %+v", r)
	}
	if r := e.run("", "version", "extra"); r.code != exitUsage {
		t.Fatalf("version extra: %+v", r)
	}
	bi := &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.modified", Value: "true"}}}
	for _, tc := range []struct {
		linked string
		bi     *debug.BuildInfo
		ok     bool
		want   string
	}{
		{"v1.2.3-4-gabc", bi, true, "v1.2.3-4-gabc"},
		{"", bi, true, "devel-0123456789ab-dirty"},
		{"", &debug.BuildInfo{Main: debug.Module{Version: "v0.9.0"}}, true, "v0.9.0"},
		{"", nil, false, "unknown"},
	} {
		if got := buildVersion(tc.linked, tc.bi, tc.ok); got != tc.want {
			t.Errorf("buildVersion(%q) = %q, want %q", tc.linked, got, tc.want)
		}
	}
}

// Shell completion: cobra's scripts, and the IDs of the store's sandboxes
// for the commands that take one (not for create's new ID).
func TestCLICompletion(t *testing.T) {
	e := newEnv(t)
	if r := e.run("", "completion", "bash"); r.code != 0 || !strings.Contains(r.stdout, "__start_ctl-manager") {
		t.Fatalf("completion bash: exit %d\n%.200s%s", r.code, r.stdout, r.stderr)
	}
	// No database yet: nothing to offer, and none is made.
	if r := e.run("", "__complete", "sandbox", "get", ""); r.code != 0 || r.stdout != ":4\n" {
		t.Fatalf("complete without a database: %+v", r)
	}
	for _, id := range []string{"sb1", "sb2", "web"} {
		e.ok("sandbox", "create", id, "--", "sleep", "infinity")
	}
	for _, args := range [][]string{
		{"sandbox", "get", "s"}, {"sandbox", "exec", "s"}, {"sandbox", "destroy", "s"},
		{"sandbox", "file", "get", "s"}, {"sandbox", "logs", "s"}, {"sandbox", "network", "s"},
	} {
		r := e.run("", append([]string{"__complete"}, args...)...)
		if r.code != 0 || r.stdout != "sb1\nsb2\n:4\n" {
			t.Errorf("complete %v: exit %d, %q", args, r.code, r.stdout)
		}
	}
	if r := e.run("", "__complete", "sandbox", "get", ""); !strings.Contains(r.stdout, "web\n") {
		t.Errorf("complete all: %q", r.stdout)
	}
	if r := e.run("", "__complete", "sandbox", "create", ""); strings.Contains(r.stdout, "sb1") {
		t.Errorf("create completed an existing ID: %q", r.stdout)
	}
	if r := e.run("", "__complete", "sandbox", "get", "sb1", ""); strings.Contains(r.stdout, "sb2") {
		t.Errorf("a second argument completed IDs: %q", r.stdout)
	}
}

// A guest's own exit 1 is 1; a call that failed is 125, never a code a
// guest's exit could be confused with below it; a usage mistake is 2.
func TestCLIExitCodes(t *testing.T) {
	e := newEnv(t)
	e.ok("sandbox", "create", "sb1", "--", "sleep", "infinity")
	for _, tc := range []struct {
		args []string
		want int
	}{
		{[]string{"sandbox", "exec", "sb1", "--", "sh", "-c", "exit 1"}, 1},
		{[]string{"sandbox", "exec", "nope", "--", "true"}, 125},
		{[]string{"sandbox", "get", "nope"}, 125},
		{[]string{"sandbox", "destroy", "nope"}, 125},
		{[]string{"sandbox", "get"}, 2},
		{[]string{"sandbox", "exec", "sb1", "--bogus"}, 2},
	} {
		if r := e.run("", tc.args...); r.code != tc.want {
			t.Errorf("%v: exit %d, want %d\n%s", tc.args, r.code, tc.want, r.stderr)
		}
	}
}
