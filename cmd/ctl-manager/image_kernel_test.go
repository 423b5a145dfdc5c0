package main

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/template"
	"github.com/ctld/ctld/internal/template/templatetest"
)

// busyboxTar is the busybox template (the host's static busybox) as a tar.
func busyboxTar(t *testing.T) []byte {
	t.Helper()
	bb := "/bin/busybox"
	if _, err := os.Stat(bb); err != nil {
		t.Fatalf("busybox-static not installed: %v", err)
	}
	dir := t.TempDir()
	if err := template.BuildBusybox(dir, bb); err != nil {
		t.Fatal(err)
	}
	return templatetest.TarDir(t, dir)
}

// TestKernelImageConfig: an image pushed to a registry on loopback (with a
// password) is imported as a block template, and a real gVisor guest
// claimed from it runs the image's entrypoint and cmd with its env, as its
// user (a name resolved in the image's /etc/passwd and /etc/group), in its
// working dir; a second claim overrides each; an overlay claim of the same
// import (over the tree the import kept in ctld's templates directory)
// runs with the same defaults.
func TestKernelImageConfig(t *testing.T) {
	ktest.RequireCgroup2(t, "cpu", "memory", "pids")
	ktest.RequireBinary(t, "runsc")
	socket, stateDir := startCtldState(t)
	cfg := filepath.Join(t.TempDir(), "ctld.toml")
	if err := os.WriteFile(cfg, []byte("state-dir = \""+stateDir+"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	reg := startLoopRegistry(t)
	app := tarOfFiles(t,
		tfile{name: "etc/passwd", body: "root:x:0:0:root:/root:/bin/sh\napp:x:1234:1000:app:/work:/bin/sh\n", mode: 0o644},
		tfile{name: "etc/group", body: "root:x:0:\nstaff:x:2345:app\n", mode: 0o644},
		tfile{name: "work/", dir: true, mode: 0o755, uid: 1234, gid: 2345},
		tfile{name: "app/", dir: true, mode: 0o755},
		tfile{name: "app/entry.sh", mode: 0o755, body: "#!/bin/sh\necho \"greeting=$GREETING cwd=$(pwd) id=$(id -u):$(id -g) args=$*\"\nexec sleep 1000000\n"})
	bb := busyboxTar(t)
	ref, digest := reg.push(t, "team/app:v1", v1.Config{
		Entrypoint: []string{"/app/entry.sh"}, Cmd: []string{"from-cmd"},
		Env: []string{"PATH=/bin:/usr/bin", "GREETING=hello-image"}, User: "app:staff", WorkingDir: "/work",
	}, bb, app)

	e := &env{t: t, socket: socket, db: filepath.Join(t.TempDir(), "manager.db")}
	out := e.ok("--config", cfg, "template", "import", "app", "--image", ref, "--size", "64Mi")
	if !strings.Contains(out, digest.String()) {
		t.Fatalf("import:\n%s", out)
	}
	t.Logf("import: %s", out)
	// A second template of the same layers: a fork of the image the first
	// stored, its overlay tree a hard-linked copy of app's; another config.
	ref2, _ := reg.push(t, "team/app2:v1", v1.Config{
		Entrypoint: []string{"/app/entry.sh"}, Cmd: []string{"second"},
		Env: []string{"PATH=/bin:/usr/bin", "GREETING=hello-second"}, User: "0", WorkingDir: "/",
	}, bb, app)
	if out := e.ok("--config", cfg, "template", "import", "app2", "--image", ref2, "--size", "64Mi"); !strings.Contains(out, "(stored before: nothing built)") {
		t.Fatalf("import of app2:\n%s", out)
	}

	logs := func(id, want string) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
			out := e.ok("sandbox", "logs", id)
			if out == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("sandbox logs %s = %q, want %q", id, out, want)
			}
		}
	}
	for _, c := range []struct {
		id, mode string
		flags    []string
		want     string
		template string
	}{
		{"ki1", "block", nil, "greeting=hello-image cwd=/work id=1234:2345 args=from-cmd\n", "app"},
		{"ki2", "block", []string{"--user", "0", "--cwd", "/tmp", "--env", "GREETING=claim", "--", "/app/entry.sh", "mine"}, "greeting=claim cwd=/tmp id=0:0 args=mine\n", "app"},
		{"ki3", "overlay", nil, "greeting=hello-image cwd=/work id=1234:2345 args=from-cmd\n", "app"},
		{"ki4", "overlay", nil, "greeting=hello-second cwd=/ id=0:0 args=second\n", "app2"}, // its tree: a linked copy of app's
	} {
		created := false
		t.Cleanup(func() {
			if created {
				e.run("", "sandbox", "destroy", c.id)
			}
		})
		out := e.ok(append([]string{"--config", cfg, "sandbox", "create", c.id, "--mode", c.mode, "--template", c.template}, c.flags...)...)
		created = true
		if !strings.Contains(out, "sandbox "+c.id+" ready") {
			t.Fatalf("create %s:\n%s", c.id, out)
		}
		logs(c.id, c.want)
		if out := e.ok("sandbox", "destroy", c.id); !strings.Contains(out, "verified: "+c.id+" generation 1 is gone") {
			t.Fatalf("destroy %s:\n%s", c.id, out)
		}
		created = false
	}
	e.ok("--config", cfg, "template", "rm", "app")
	e.ok("--config", cfg, "template", "rm", "app2")
	if _, err := os.Stat(filepath.Join(stateDir, "templates", "app")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("overlay tree after template rm: %v", err)
	}
}
