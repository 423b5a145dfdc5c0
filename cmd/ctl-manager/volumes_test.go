package main

import (
	"strings"
	"testing"
)

// TestCLIPauseResume: sandbox pause prints the head and the verdict,
// resume runs the next generation from the last claim's spec, snapshot ls
// shows the head, and the calls the fake node has no store for fail with
// the one-line error.
func TestCLIPauseResume(t *testing.T) {
	e := newEnv(t)
	e.ok("sandbox", "create", "sb1", "--mode", "block", "--", "sleep", "infinity")
	out := e.ok("sandbox", "pause", "sb1")
	if !strings.Contains(out, "sandbox sb1 generation 1 paused") || !strings.Contains(out, "head 1: block generation 1") || !strings.Contains(out, "verified: sb1 generation 1 is gone") {
		t.Fatalf("pause output:\n%s", out)
	}
	if out := e.ok("sandbox", "resume", "sb1"); !strings.Contains(out, "sandbox sb1 ready: generation 2") {
		t.Fatalf("resume output:\n%s", out)
	}
	if out := e.ok("snapshot", "ls", "sb1"); !strings.Contains(out, "sandbox sb1: head 1 = block generation 1") {
		t.Fatalf("snapshot ls output:\n%s", out)
	}
	r := e.run("", "sandbox", "snapshot", "sb1", "s1")
	if r.code != 1 || !errLine.MatchString(r.stderr) || !strings.Contains(r.stderr, "no block store") {
		t.Fatalf("snapshot on the fake node: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := e.run("", "sandbox", "fork", "sb1"); r.code != 2 || !strings.Contains(r.stderr, "SOURCE and NEW") {
		t.Fatalf("fork with one argument: exit %d, stderr %q", r.code, r.stderr)
	}
}
