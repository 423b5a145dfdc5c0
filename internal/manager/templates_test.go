package manager

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/ctld/ctld/internal/api"
)

// Each part of the image's config is a default a claim overrides on its
// own: command, env by variable, cwd, user (root too, through Spec.User).
func TestWithDefaults(t *testing.T) {
	d := ImageDefaults{Entrypoint: []string{"/entry"}, Cmd: []string{"serve", "--port=80"}, Env: []string{"PATH=/bin", "MODE=prod"}, Cwd: "/srv", UID: 33, GID: 44}
	for _, c := range []struct {
		name string
		in   Spec
		want api.Process
	}{
		{"none set", Spec{}, api.Process{Args: []string{"/entry", "serve", "--port=80"}, Env: []string{"PATH=/bin", "MODE=prod"}, Cwd: "/srv", UID: 33, GID: 44}},
		{"all set", Spec{Process: api.Process{Args: []string{"sh"}, Env: []string{"MODE=dev", "X=1"}, Cwd: "/tmp", UID: 1000, GID: 1000}},
			api.Process{Args: []string{"sh"}, Env: []string{"PATH=/bin", "MODE=dev", "X=1"}, Cwd: "/tmp", UID: 1000, GID: 1000}},
		{"root asked", Spec{User: &api.User{}}, api.Process{Args: []string{"/entry", "serve", "--port=80"}, Env: []string{"PATH=/bin", "MODE=prod"}, Cwd: "/srv"}},
	} {
		if got := c.in.withDefaults(d).Process; !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %+v\nwant %+v", c.name, got, c.want)
		}
	}
	// The image's slices are not shared with the spec.
	s := Spec{}.withDefaults(d)
	s.Process.Args[0] = "changed"
	if d.Entrypoint[0] != "/entry" {
		t.Error("withDefaults aliased the image's entrypoint")
	}
}

type defaultsFunc func(context.Context, api.RootFS) (ImageDefaults, bool, error)

func (f defaultsFunc) Defaults(ctx context.Context, r api.RootFS) (ImageDefaults, bool, error) {
	return f(ctx, r)
}

// A template whose defaults cannot be read fails the claim; one without
// any leaves the spec (and Spec.User still applies).
func TestApplyDefaults(t *testing.T) {
	m := &Manager{Templates: defaultsFunc(func(context.Context, api.RootFS) (ImageDefaults, bool, error) {
		return ImageDefaults{}, false, errors.New("store down")
	})}
	if _, err := m.applyDefaults(t.Context(), Spec{RootFS: api.RootFS{Template: "t"}}); err == nil {
		t.Fatal("unreadable defaults did not fail the claim")
	}
	m.Templates = defaultsFunc(func(context.Context, api.RootFS) (ImageDefaults, bool, error) {
		return ImageDefaults{UID: 5}, false, nil
	})
	s, err := m.applyDefaults(t.Context(), Spec{User: &api.User{UID: 7, GID: 8}})
	if err != nil || s.Process.UID != 7 || s.Process.GID != 8 {
		t.Fatalf("no defaults: %+v, %v", s.Process, err)
	}
}
