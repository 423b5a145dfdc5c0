package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/recipe"
)

// TestKernelCodePython builds the python template from its shipped recipe
// (`template build --root overlay`, from the tree test/recipe/setup.sh
// cached on the host: the VM has no Debian mirror) into a real ctld's
// templates directory (only the tree: building and storing the block
// image took ~200 s under emulation; TestKernelImageConfig covers block
// templates), and runs Python snippets in an overlay guest of it
// through the service:
// one that prints, one that fails with a traceback, one that reads stdin,
// one that writes a file the files call reads, one past its timeout; node
// is refused (the recipe serves python and sh). Then code of a Python
// hello against exec of python3 -c in the same sandbox.
func TestKernelCodePython(t *testing.T) {
	ktest.RequireCgroup2(t, "cpu", "memory", "pids")
	ktest.RequireBinary(t, "runsc")
	e, store := buildRecipeTemplate(t, "python", "languages python, sh")
	rig := startCodeSandbox(t, e, append([]string{"--template", "python:overlay"}, store...),
		client.CreateRequest{Template: "python", Resources: &client.Resources{CPU: "1", Memory: "512Mi", PIDs: 128}, User: &client.User{UID: 1000, GID: 1000}}, "python")
	c, sb, code, ctx := rig.c, rig.sb, rig.code, context.Background()
	if tpls, err := c.Templates(ctx); err != nil || len(tpls) != 1 || strings.Join(tpls[0].Languages, ",") != "python,sh" {
		t.Fatalf("templates = %+v, %v", tpls, err)
	}
	if res := code(client.CodeRequest{Source: "import os, sys\nprint('hello', sys.version_info[0], os.getuid())"}); res.ExitCode != 0 || string(res.Stdout) != "hello 3 1000\n" {
		t.Fatalf("print: %+v (stderr %s)", res, res.Stderr)
	}
	if res := code(client.CodeRequest{Source: "print('before')\n1 / 0\n"}); res.ExitCode != 1 || string(res.Stdout) != "before\n" ||
		!strings.HasPrefix(string(res.Stderr), "Traceback (most recent call last):") || !strings.Contains(string(res.Stderr), "ZeroDivisionError: division by zero") {
		t.Fatalf("traceback: %+v (stderr %s)", res, res.Stderr)
	}
	if res := code(client.CodeRequest{Source: "import sys\nprint(sys.stdin.read().upper(), end='')", Stdin: []byte("from stdin\n")}); res.ExitCode != 0 || string(res.Stdout) != "FROM STDIN\n" {
		t.Fatalf("stdin: %+v", res)
	}
	if res := code(client.CodeRequest{Source: "with open('/home/user/out.txt', 'w') as f:\n    f.write('written by python\\n')"}); res.ExitCode != 0 {
		t.Fatalf("write: %+v (stderr %s)", res, res.Stderr)
	}
	var got bytes.Buffer
	if _, err := c.ReadFile(ctx, sb.ID, "/home/user/out.txt", &got); err != nil || got.String() != "written by python\n" {
		t.Fatalf("files read = %q, %v", got.String(), err)
	}
	start := time.Now()
	if _, err := c.Code(ctx, sb.ID, client.CodeRequest{Language: "python", Source: "import time\nprint('sleeping', flush=True)\ntime.sleep(120)", TimeoutSec: 3}); err == nil || !strings.Contains(err.Error(), "timed out") {
		t.Fatalf("past its timeout: %v", err)
	}
	if d := time.Since(start); d > 45*time.Second {
		t.Fatalf("the timed-out snippet took %v", d)
	}
	if _, err := c.Code(ctx, sb.ID, client.CodeRequest{Language: "node", Source: "console.log(1)"}); err == nil || !strings.Contains(err.Error(), `serves python, sh, not node`) {
		t.Fatalf("node on python: %v", err)
	}
	var outb, errb bytes.Buffer
	if n, err := c.CodeStream(ctx, sb.ID, client.CodeRequest{Language: "sh", Source: "echo sh-out; echo sh-err >&2; exit 6"}, &outb, &errb); err != nil || n != 6 || outb.String() != "sh-out\n" || errb.String() != "sh-err\n" {
		t.Fatalf("sh stream = %d %q %q, %v", n, outb.String(), errb.String(), err)
	}
	ents, err := c.ListFiles(ctx, sb.ID, "/tmp")
	if err != nil || len(ents) != 0 {
		t.Fatalf("/tmp after the runs = %+v, %v", ents, err)
	}

	// code of a Python hello vs exec of python3 -c, same sandbox.
	benchCodeVsExec(t, c, sb.ID, 3, client.CodeRequest{Language: "python", Source: "print('hello')"}, []string{"python3", "-c", "print('hello')"}, "code python hello", "exec python3 -c")
	rig.destroy()
}

// buildRecipeTemplate builds the shipped recipe templates/name.toml with
// `template build --root overlay` from the tree test/recipe/setup.sh cached
// on the host (the VM has no Debian mirror) into a real ctld's templates
// directory, checks the output names langs and that a second build is up
// to date, and returns the env of that ctld and the store flags.
func buildRecipeTemplate(t *testing.T, name, langs string) (*env, []string) {
	t.Helper()
	_, src, _, _ := runtime.Caller(0)
	recipeFile := filepath.Join(filepath.Dir(src), "..", "..", "templates", name+".toml")
	b, err := os.ReadFile(recipeFile)
	if err != nil {
		t.Fatal(err)
	}
	r, err := recipe.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	cache := os.Getenv("CTLD_RECIPE_CACHE")
	if cache == "" {
		cache = defaultRecipeCache
	}
	if _, err := os.Stat(filepath.Join(cache, r.TreeDigest(), "recipe.json")); err != nil {
		t.Fatalf("the %s recipe's tree is not in %s (run test/recipe/setup.sh on the host: the VM has no mirror): %v", name, cache, err)
	}
	socket, stateDir := startCtldState(t)
	e := &env{t: t, socket: socket, db: filepath.Join(t.TempDir(), "manager.db")}
	store := []string{"--store", filepath.Join(stateDir, "blockstore"), "--node-key", filepath.Join(stateDir, "blockstore.key")}
	t0 := time.Now()
	build := append([]string{"--timeout", "12m", "template", "build", name, "-f", recipeFile, "--cache", cache, "--root", "overlay"}, store...)
	out := e.ok(build...)
	if !strings.Contains(out, "(tree from the cache), overlay tree only") || !strings.Contains(out, langs) {
		t.Fatalf("template build: %s", out)
	}
	t.Logf("template build (%v): %s", time.Since(t0).Round(time.Millisecond), strings.TrimSpace(out))
	if _, err := os.Stat(filepath.Join(stateDir, "templates", name, "etc", "ctl-template")); err != nil {
		t.Fatalf("the tree in ctld's templates dir: %v", err)
	}
	if out := e.ok(build...); !strings.Contains(out, "up to date") {
		t.Fatalf("second template build: %s", out)
	}
	return e, store
}
