// Package runtimetest is the contract of guest.Runtime, the node's view of
// the container runtime: one suite run against the fake kernel's runtime
// on the host (internal/node/fakekernel) and against *runsc.Runtime with
// real gVisor guests in the test VM (internal/runsc), the way
// containerd's snapshots testsuite runs every snapshotter. A case that
// passes on one and fails on the other is a fake that lies. A real guest
// takes seconds to start under the VM's emulation: only two cases start
// one.
package runtimetest

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/node/guest"
	"github.com/ctld/ctld/internal/runsc"
	"github.com/ctld/ctld/internal/testutil"
)

// Subject is one implementation under test.
type Subject struct {
	Runtime guest.Runtime
	// Bundle writes the bundle of container id (a busybox root; init
	// runs until killed) and returns its dir.
	Bundle func(t *testing.T, id string) string
}

// New makes a fresh subject for one case; it cleans up after itself.
type New func(t *testing.T) Subject

// Run runs every case against the subjects newSubject makes.
func Run(t *testing.T, newSubject New) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
			defer cancel()
			c.run(t, ctx, newSubject(t))
		})
	}
}

// started creates and starts container id from a new bundle; it is
// deleted when the case ends.
func started(t *testing.T, ctx context.Context, s Subject, id string) {
	t.Helper()
	created(t, ctx, s, id)
	if err := s.Runtime.Start(ctx, id); err != nil {
		t.Fatalf("start %s: %v", id, err)
	}
}

// created creates container id from a new bundle, deleted when the case
// ends, and returns the bundle's dir.
func created(t *testing.T, ctx context.Context, s Subject, id string) string {
	t.Helper()
	bundle := s.Bundle(t, id)
	t.Cleanup(func() {
		if err := s.Runtime.Delete(context.Background(), id); err != nil {
			t.Errorf("cleanup: delete %s: %v", id, err)
		}
	})
	if err := s.Runtime.Create(ctx, id, bundle); err != nil {
		t.Fatalf("create %s: %v", id, err)
	}
	return bundle
}

func known(t *testing.T, r guest.Runtime, id string) bool {
	t.Helper()
	ids, err := r.Known()
	if err != nil {
		t.Fatalf("known: %v", err)
	}
	return slices.Contains(ids, id)
}

// exec runs args in id with stdin, returning stdout+stderr and the code.
func exec(t *testing.T, ctx context.Context, r guest.Runtime, id, stdin string, args ...string) (string, int) {
	t.Helper()
	var out bytes.Buffer
	code, err := r.Exec(ctx, id, runsc.ExecProcess{Args: args}, strings.NewReader(stdin), &out, &out)
	if err != nil {
		t.Fatalf("exec %q in %s: %v", args, id, err)
	}
	return out.String(), code
}

// gone polls CheckGone for up to 5 s: a guest's processes may take a
// moment to be reaped after Delete returned.
func gone(ctx context.Context, r guest.Runtime, id string) (bool, string) {
	return testutil.Eventually(5*time.Second, func() (bool, string) { return r.CheckGone(ctx, id) })
}

var cases = []struct {
	name string
	run  func(t *testing.T, ctx context.Context, s Subject)
}{
	{"an unknown container does not exist, and deleting it is success", func(t *testing.T, ctx context.Context, s Subject) {
		r := s.Runtime
		const id = "rt-none"
		if known(t, r, id) {
			t.Error("an unknown container is known")
		}
		if ok, detail := r.CheckGone(ctx, id); !ok {
			t.Errorf("check gone of an unknown container: %s", detail)
		}
		if err := r.Start(ctx, id); !errors.Is(err, runsc.ErrNotExist) {
			t.Errorf("start: %v, want runsc.ErrNotExist", err)
		}
		if err := r.Kill(ctx, id, syscall.SIGKILL, true); !errors.Is(err, runsc.ErrNotExist) {
			t.Errorf("kill: %v, want runsc.ErrNotExist", err)
		}
		var out bytes.Buffer
		if code, err := r.Exec(ctx, id, runsc.ExecProcess{Args: []string{"true"}}, nil, &out, &out); err == nil {
			t.Errorf("exec: code %d, nil error; want an error", code)
		}
		for i := range 2 {
			if err := r.Delete(ctx, id); err != nil {
				t.Errorf("delete %d: %v", i+1, err)
			}
		}
		if d := r.ContainerLogDir(id); filepath.Dir(d) != r.LogRoot() {
			t.Errorf("log dir %q is not a dir of the log root %q", d, r.LogRoot())
		}
	}},
	{"a bad container id is refused", func(t *testing.T, ctx context.Context, s Subject) {
		r := s.Runtime
		bundle := s.Bundle(t, "rt-bad")
		for _, id := range []string{"", "../x", "a/b", "-x"} {
			if err := r.Create(ctx, id, bundle); err == nil {
				r.Delete(ctx, id)
				t.Errorf("create %q: nil, want an error", id)
			}
			if err := r.Start(ctx, id); err == nil {
				t.Errorf("start %q: nil, want an error", id)
			}
			if err := r.Kill(ctx, id, syscall.SIGKILL, true); err == nil {
				t.Errorf("kill %q: nil, want an error", id)
			}
			var out bytes.Buffer
			if _, err := r.Exec(ctx, id, runsc.ExecProcess{Args: []string{"true"}}, nil, &out, &out); err == nil {
				t.Errorf("exec in %q: nil, want an error", id)
			}
			if err := r.Delete(ctx, id); err == nil {
				t.Errorf("delete %q: nil, want an error", id)
			}
		}
		// Nothing is made for a bad id, least of all outside the log root.
		if _, err := os.Lstat(filepath.Join(r.LogRoot(), "..", "x")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("a bad id made %s: %v", filepath.Join(r.LogRoot(), "..", "x"), err)
		}
	}},
	{"a container is made once, runs commands, and its deletion is proven", func(t *testing.T, ctx context.Context, s Subject) {
		r := s.Runtime
		const id = "rt-life"
		bundle := created(t, ctx, s, id)
		if !known(t, r, id) {
			t.Error("a created container is not known")
		}
		if ok, detail := r.CheckGone(ctx, id); ok {
			t.Errorf("check gone of a created container: ok (%s)", detail)
		}
		if err := r.Create(ctx, id, bundle); !errors.Is(err, fs.ErrExist) {
			t.Errorf("create of an existing container: %v, want fs.ErrExist", err)
		}
		if !known(t, r, id) {
			t.Fatal("the refused create took the existing container")
		}
		if err := r.Start(ctx, id); err != nil {
			t.Fatalf("start: %v", err)
		}
		if err := r.Start(ctx, id); err == nil {
			t.Error("start of a running container: nil, want an error")
		}
		if out, code := exec(t, ctx, r, id, "", "echo", "hello"); out != "hello\n" || code != 0 {
			t.Errorf("echo hello = %q, code %d", out, code)
		}
		if _, code := exec(t, ctx, r, id, "", "false"); code != 1 {
			t.Errorf("false: code %d, want 1", code)
		}
		if out, code := exec(t, ctx, r, id, "from stdin", "cat"); out != "from stdin" || code != 0 {
			t.Errorf("cat = %q, code %d; want stdin back", out, code)
		}
		if err := r.Kill(ctx, id, syscall.SIGKILL, true); err != nil {
			t.Fatalf("kill: %v", err)
		}
		for i := range 2 {
			if err := r.Delete(ctx, id); err != nil {
				t.Fatalf("delete %d: %v", i+1, err)
			}
		}
		if ok, detail := gone(ctx, r, id); !ok {
			t.Errorf("check gone after delete: %s", detail)
		}
		if known(t, r, id) {
			t.Error("a deleted container is known")
		}
		if err := r.Start(ctx, id); !errors.Is(err, runsc.ErrNotExist) {
			t.Errorf("start of a deleted container: %v, want runsc.ErrNotExist", err)
		}
	}},
	{"delete ends a running container", func(t *testing.T, ctx context.Context, s Subject) {
		r := s.Runtime
		const id = "rt-del"
		started(t, ctx, s, id)
		if err := r.Delete(ctx, id); err != nil {
			t.Fatalf("delete: %v", err)
		}
		if ok, detail := gone(ctx, r, id); !ok {
			t.Errorf("check gone after delete: %s", detail)
		}
	}},
}
