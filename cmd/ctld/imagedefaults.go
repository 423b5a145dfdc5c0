package main

import (
	"context"
	"fmt"
	"slices"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/node"
	"github.com/ctld/ctld/internal/template"
)

var _ node.TemplateDefaults = blockTemplates{}

// Defaults reads template name's image config, recorded sealed beside it
// in the block store by a registry import (template.ReadMeta), in either
// root mode (an import keeps the overlay tree of the same name). A name
// no import can make has none; the config is checked as a claim's process
// is before a claim takes it.
func (t blockTemplates) Defaults(ctx context.Context, name string) (node.ImageDefaults, bool, error) {
	if blockstore.Template(name).Check() != nil {
		return node.ImageDefaults{}, false, nil
	}
	meta, ok, err := template.ReadMeta(ctx, t.repo, name)
	if err != nil || !ok {
		return node.ImageDefaults{}, false, err
	}
	c := meta.Config
	p := api.Process{Args: append(slices.Clone(c.Entrypoint), c.Cmd...), Env: c.Env, Cwd: c.WorkingDir, UID: c.UID, GID: c.GID}
	if err := api.ValidateProcess(p); err != nil {
		return node.ImageDefaults{}, false, fmt.Errorf("template %s's image config: %w", name, err)
	}
	return node.ImageDefaults{Entrypoint: c.Entrypoint, Cmd: c.Cmd, Env: c.Env, Cwd: c.WorkingDir, UID: c.UID, GID: c.GID}, true, nil
}
