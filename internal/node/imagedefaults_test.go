package node

import (
	"reflect"
	"testing"

	"github.com/ctld/ctld/internal/journal"
)

// Each part of the image's config is a default a claim overrides on its
// own: command, env by variable, cwd, user (root too, through UserSet);
// the result shares no slice with the image's.
func TestWithImageDefaults(t *testing.T) {
	d := ImageDefaults{Entrypoint: []string{"/entry"}, Cmd: []string{"serve", "--port=80"}, Env: []string{"PATH=/bin", "MODE=prod"}, Cwd: "/srv", UID: 33, GID: 44}
	for _, c := range []struct {
		name    string
		in, out journal.Process
	}{
		{"none set", journal.Process{}, journal.Process{Args: []string{"/entry", "serve", "--port=80"}, Env: []string{"PATH=/bin", "MODE=prod"}, Cwd: "/srv", UID: 33, GID: 44}},
		{"all set", journal.Process{Args: []string{"sh"}, Env: []string{"MODE=dev", "X=1"}, Cwd: "/tmp", UID: 1000, GID: 1000},
			journal.Process{Args: []string{"sh"}, Env: []string{"PATH=/bin", "MODE=dev", "X=1"}, Cwd: "/tmp", UID: 1000, GID: 1000}},
		{"root asked", journal.Process{UserSet: true}, journal.Process{Args: []string{"/entry", "serve", "--port=80"}, Env: []string{"PATH=/bin", "MODE=prod"}, Cwd: "/srv", UserSet: true}},
	} {
		if got := withImageDefaults(c.in, d); !reflect.DeepEqual(got, c.out) {
			t.Errorf("%s: %+v\nwant %+v", c.name, got, c.out)
		}
	}
	p := withImageDefaults(journal.Process{}, d)
	p.Args[0], p.Env[0] = "changed", "changed"
	if d.Entrypoint[0] != "/entry" || d.Env[0] != "PATH=/bin" {
		t.Error("withImageDefaults aliased the image's slices")
	}
	if p := withImageDefaults(journal.Process{}, ImageDefaults{Cwd: "/w"}); p.Args != nil {
		t.Errorf("no entrypoint or cmd: args %q, want none (the node's default command)", p.Args)
	}
}
