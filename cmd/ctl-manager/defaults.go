package main

import (
	"context"
	"errors"
	"io/fs"
	"os"

	"github.com/spf13/pflag"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/manager"
	"github.com/ctld/ctld/internal/template"
)

// storeDefaults gives a claim its template image's defaults, read from
// the block store ctld's configuration file names (as the template
// commands find it), in either root mode: an import keeps the overlay
// tree of the same template beside its block image. A host without the
// node key has no block store to read: no defaults; neither has a user
// who cannot read the key. Any other failure fails the claim.
type storeDefaults struct{ c *cli }

func (s storeDefaults) Defaults(ctx context.Context, r api.RootFS) (manager.ImageDefaults, bool, error) {
	if r.Template == "" {
		return manager.ImageDefaults{}, false, nil
	}
	tf := &templateFlags{getenv: s.c.getenv}
	fl := pflag.NewFlagSet("store", pflag.ContinueOnError)
	tf.register(fl, "")
	if err := s.c.applyStoreConfig(fl); err != nil {
		return manager.ImageDefaults{}, false, err
	}
	switch f, err := os.Open(tf.keyFile); {
	case errors.Is(err, fs.ErrNotExist):
		return manager.ImageDefaults{}, false, nil
	case errors.Is(err, fs.ErrPermission):
		// An operator of group ctld may claim but not read the node key
		// (root's): its claim runs without the image's defaults (ctld
		// applying them itself is the fix; known limitation).
		s.c.logger().Warn("template image defaults not applied: the node key is not readable by this user", "template", r.Template, "key", tf.keyFile)
		return manager.ImageDefaults{}, false, nil
	case err == nil:
		f.Close()
	}
	_, repo, err := tf.open(ctx, false)
	if err != nil {
		return manager.ImageDefaults{}, false, err
	}
	meta, ok, err := template.ReadMeta(ctx, repo, r.Template)
	if err != nil || !ok {
		return manager.ImageDefaults{}, false, err
	}
	c := meta.Config
	return manager.ImageDefaults{Entrypoint: c.Entrypoint, Cmd: c.Cmd, Env: c.Env, Cwd: c.WorkingDir, UID: c.UID, GID: c.GID}, true, nil
}
