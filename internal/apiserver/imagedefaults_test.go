package apiserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/ctld/ctld/internal/agent"
	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/apiserver"
	"github.com/ctld/ctld/internal/apiserver/servicetest"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/names"
	"github.com/ctld/ctld/internal/node"
	"github.com/ctld/ctld/internal/runsc"
	"github.com/ctld/ctld/internal/testutil"
)

// fakeDefaults are templates' image defaults by name; failing makes every
// read fail.
type fakeDefaults struct {
	by      map[string]node.ImageDefaults
	failing bool
}

func (f *fakeDefaults) Defaults(_ context.Context, name string) (node.ImageDefaults, bool, error) {
	if f.failing {
		return node.ImageDefaults{}, false, errors.New("store down")
	}
	d, ok := f.by[name]
	return d, ok, nil
}

// TestClaimTakesImageDefaults: ctld fills what a claim (from any client:
// here api.Client over the socket) leaves unset from its template image's
// config, each part on its own: no args is entrypoint + cmd, the env is
// the image's with the claim's variables added or replacing, no cwd is
// the working dir, no user is the image's user; a claim's explicit values
// win, root too (user_set). A template without defaults runs the node's
// default command; defaults that cannot be read refuse the claim, which
// leaves nothing.
func TestClaimTakesImageDefaults(t *testing.T) {
	defs := &fakeDefaults{by: map[string]node.ImageDefaults{"busybox": {
		Entrypoint: []string{"/app/entry"}, Cmd: []string{"serve", "--port=80"},
		Env: []string{"PATH=/bin", "MODE=prod"}, Cwd: "/srv", UID: 33, GID: 44,
	}}}
	n, k := fakeNodeWith(t, func(d *node.Deps) { d.ImageDefaults = defs })
	dir := testutil.SocketDir(t)
	ln, err := net.Listen("unix", filepath.Join(dir, "api.sock"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- (&apiserver.Server{Service: apiserver.Adapter{N: n}, AllowedGID: -1}).Serve(ctx, ln) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	c := &api.Client{SocketPath: filepath.Join(dir, "api.sock")}
	spec := func(id string) specs.Process {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(k.RunDir(), "bundles", names.Generation(id, 1), "config.json"))
		if err != nil {
			t.Fatal(err)
		}
		var s specs.Spec
		if err := json.Unmarshal(b, &s); err != nil || s.Process == nil {
			t.Fatalf("bundle of %s: %v", id, err)
		}
		return *s.Process
	}
	// user is the workload's user: the agent (the guest's init, root)
	// starts it as the ids of its settings.
	user := func(p specs.Process) (uid, gid string) {
		for _, e := range p.Env {
			if v, ok := strings.CutPrefix(e, agent.EnvUID+"="); ok {
				uid = v
			}
			if v, ok := strings.CutPrefix(e, agent.EnvGID+"="); ok {
				gid = v
			}
		}
		return uid, gid
	}
	env := func(p specs.Process) []string {
		return slices.DeleteFunc(slices.Clone(p.Env), func(e string) bool { return strings.HasPrefix(e, runsc.AgentEnvPrefix) })
	}
	release := func(id string) {
		t.Helper()
		if _, err := c.Release(context.Background(), id, api.ReleaseRequest{OperationID: "rel-" + id, Generation: 1}); err != nil {
			t.Fatal(err)
		}
	}

	// Nothing set: all from the image.
	req := servicetest.Claim("op-a", 1)
	if _, err := c.Claim(context.Background(), "sb-a", req); err != nil {
		t.Fatal(err)
	}
	p := spec("sb-a")
	if want := runsc.AgentArgs([]string{"/app/entry", "serve", "--port=80"}); !slices.Equal(p.Args, want) {
		t.Errorf("args %q, want %q", p.Args, want)
	}
	if got := env(p); !slices.Equal(got, []string{"PATH=/bin", "MODE=prod"}) {
		t.Errorf("env %q", got)
	}
	if uid, gid := user(p); p.Cwd != "/srv" || uid != "33" || gid != "44" {
		t.Errorf("cwd %q, user %s:%s; want /srv, 33:44", p.Cwd, uid, gid)
	}
	release("sb-a")

	// Everything set, root explicitly: the claim's, the env merged.
	req = servicetest.Claim("op-b", 1)
	req.Process = api.Process{Args: []string{"/bin/sh"}, Env: []string{"MODE=dev", "X=1"}, Cwd: "/tmp", UserSet: true}
	if _, err := c.Claim(context.Background(), "sb-b", req); err != nil {
		t.Fatal(err)
	}
	p = spec("sb-b")
	if want := runsc.AgentArgs([]string{"/bin/sh"}); !slices.Equal(p.Args, want) {
		t.Errorf("args %q, want %q", p.Args, want)
	}
	if got := env(p); !slices.Equal(got, []string{"PATH=/bin", "MODE=dev", "X=1"}) {
		t.Errorf("env %q", got)
	}
	if uid, gid := user(p); p.Cwd != "/tmp" || uid != "0" || gid != "0" {
		t.Errorf("cwd %q, user %s:%s; want /tmp, root", p.Cwd, uid, gid)
	}
	release("sb-b")

	// A user named by ids (no user_set needed) wins too.
	req = servicetest.Claim("op-c", 1)
	req.Process = api.Process{UID: 1000, GID: 1000}
	if _, err := c.Claim(context.Background(), "sb-c", req); err != nil {
		t.Fatal(err)
	}
	if uid, gid := user(spec("sb-c")); uid != "1000" || gid != "1000" {
		t.Errorf("user %s:%s; want 1000:1000", uid, gid)
	}
	release("sb-c")

	// A template without defaults: the node's default command, as root.
	delete(defs.by, "busybox")
	if _, err := c.Claim(context.Background(), "sb-d", servicetest.Claim("op-d", 1)); err != nil {
		t.Fatal(err)
	}
	p = spec("sb-d")
	if uid, _ := user(p); p.Args[len(p.Args)-2] != "/bin/sleep" || uid != "0" {
		t.Errorf("no defaults: args %q, uid %s", p.Args, uid)
	}
	release("sb-d")

	// Defaults that cannot be read: refused, nothing claimed.
	defs.failing = true
	if _, err := c.Claim(context.Background(), "sb-e", servicetest.Claim("op-e", 1)); errdefs.CodeOf(err) != errdefs.CodeUnavailable {
		t.Fatalf("claim with unreadable defaults: %v, want unavailable", err)
	}
	if _, err := c.Get(context.Background(), "sb-e"); errdefs.CodeOf(err) != errdefs.CodeNotFound {
		t.Fatalf("sandbox after the refused claim: %v, want not found", err)
	}
}
