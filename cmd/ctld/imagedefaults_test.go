package main

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/node"
	"github.com/ctld/ctld/internal/template"
	"github.com/ctld/ctld/internal/template/templatetest"
)

// TestBlockTemplatesDefaults: ctld reads a template's image config from
// the metadata an import sealed beside it in the block store; a template
// with none, or a name no import can make, has no defaults; a recorded
// config a claim could not carry (an env entry without '=') is an error,
// which fails the claim.
func TestBlockTemplatesDefaults(t *testing.T) {
	ctx := t.Context()
	_, repo := templatetest.Repo(t)
	put := func(name string, c template.ImageConfig) {
		t.Helper()
		b, err := json.Marshal(template.Meta{Source: "registry", Ref: "r/" + name + ":1", Config: c})
		if err != nil {
			t.Fatal(err)
		}
		if err := repo.PutMeta(ctx, blockstore.Template(name), b); err != nil {
			t.Fatal(err)
		}
	}
	put("web", template.ImageConfig{Entrypoint: []string{"/entry"}, Cmd: []string{"serve"}, Env: []string{"PATH=/bin"}, WorkingDir: "/srv", User: "web", UID: 33, GID: 34})
	put("bad", template.ImageConfig{Env: []string{"NOEQUALS"}})
	tpl := blockTemplates{repo}
	d, ok, err := tpl.Defaults(ctx, "web")
	want := node.ImageDefaults{Entrypoint: []string{"/entry"}, Cmd: []string{"serve"}, Env: []string{"PATH=/bin"}, Cwd: "/srv", UID: 33, GID: 34}
	if err != nil || !ok || !slices.Equal(d.Entrypoint, want.Entrypoint) || !slices.Equal(d.Cmd, want.Cmd) || !slices.Equal(d.Env, want.Env) ||
		d.Cwd != want.Cwd || d.UID != 33 || d.GID != 34 {
		t.Fatalf("web = %+v, %v, %v", d, ok, err)
	}
	for _, name := range []string{"plain", "not a name", "../x"} {
		if _, ok, err := tpl.Defaults(ctx, name); ok || err != nil {
			t.Errorf("%q = %v, %v; want none", name, ok, err)
		}
	}
	if _, _, err := tpl.Defaults(ctx, "bad"); err == nil {
		t.Error("a config with a bad env entry was taken")
	}
}
