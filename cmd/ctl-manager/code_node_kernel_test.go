package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/ktest"
)

// TestKernelCodeNode is TestKernelCodePython for the node template
// (templates/node.toml, Debian's nodejs): it builds the template's overlay
// tree from the cached recipe tree into a real ctld and runs JavaScript
// snippets in a guest of it through the service (the service runs code
// through ctld's guest calls): one that prints, one that throws (its
// stack trace on stderr, exit 1), one that reads stdin, one that writes a
// file the files call reads, one past its timeout; python is refused (the
// recipe serves node and sh).
//
// Not in make test (494 s in a loaded VM: the 262 MB tree's copy took
// 269 s, each node start ~19 s under TCG); `make test-code-node` runs it.
func TestKernelCodeNode(t *testing.T) {
	ktest.RequireCgroup2(t, "cpu", "memory", "pids")
	ktest.RequireBinary(t, "runsc")
	e, store := buildRecipeTemplate(t, "node", "languages node, sh")
	rig := startCodeSandbox(t, e, append([]string{"--template", "node:overlay"}, store...),
		client.CreateRequest{Template: "node", Resources: &client.Resources{CPU: "1", Memory: "512Mi", PIDs: 128}, User: &client.User{UID: 1000, GID: 1000}}, "node")
	c, sb, code, ctx := rig.c, rig.sb, rig.code, context.Background()
	if tpls, err := c.Templates(ctx); err != nil || len(tpls) != 1 || strings.Join(tpls[0].Languages, ",") != "node,sh" {
		t.Fatalf("templates = %+v, %v", tpls, err)
	}
	if res := code(client.CodeRequest{Source: "console.log('hello', process.version.startsWith('v'), process.getuid())"}); res.ExitCode != 0 || string(res.Stdout) != "hello true 1000\n" {
		t.Fatalf("print: %+v (stderr %s)", res, res.Stderr)
	}
	if res := code(client.CodeRequest{Source: "console.log('before')\nfunction f() { throw new Error('boom from node') }\nf()\n"}); res.ExitCode != 1 || string(res.Stdout) != "before\n" ||
		!strings.Contains(string(res.Stderr), "Error: boom from node") || !strings.Contains(string(res.Stderr), "    at f (") {
		t.Fatalf("stack trace: %+v (stderr %s)", res, res.Stderr)
	}
	if res := code(client.CodeRequest{Source: "let d = ''\nprocess.stdin.on('data', c => d += c)\nprocess.stdin.on('end', () => process.stdout.write(d.toUpperCase()))",
		Stdin: []byte("from stdin\n")}); res.ExitCode != 0 || string(res.Stdout) != "FROM STDIN\n" {
		t.Fatalf("stdin: %+v (stderr %s)", res, res.Stderr)
	}
	if res := code(client.CodeRequest{Source: "require('fs').writeFileSync('/home/user/out.txt', 'written by node\\n')"}); res.ExitCode != 0 {
		t.Fatalf("write: %+v (stderr %s)", res, res.Stderr)
	}
	var got bytes.Buffer
	if _, err := c.ReadFile(ctx, sb.ID, "/home/user/out.txt", &got); err != nil || got.String() != "written by node\n" {
		t.Fatalf("files read = %q, %v", got.String(), err)
	}
	start := time.Now()
	if _, err := c.Code(ctx, sb.ID, client.CodeRequest{Language: "node", Source: "console.log('sleeping')\nsetTimeout(() => {}, 120000)", TimeoutSec: 3}); err == nil || !strings.Contains(err.Error(), "timed out") {
		t.Fatalf("past its timeout: %v", err)
	}
	if d := time.Since(start); d > 45*time.Second {
		t.Fatalf("the timed-out snippet took %v", d)
	}
	if _, err := c.Code(ctx, sb.ID, client.CodeRequest{Language: "python", Source: "print(1)"}); err == nil || !strings.Contains(err.Error(), `serves node, sh, not python`) {
		t.Fatalf("python on node: %v", err)
	}
	ents, err := c.ListFiles(ctx, sb.ID, "/tmp")
	if err != nil || len(ents) != 0 {
		t.Fatalf("/tmp after the runs = %+v, %v", ents, err)
	}
	rig.destroy()
}
