package node

import (
	"context"
	"slices"
	"strings"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
)

// ImageDefaults is how a template's image asks to be run (its config's
// entrypoint, cmd, env, user resolved in the image at import, working
// dir): the defaults of a claim of that template, in either root mode.
type ImageDefaults struct {
	Entrypoint []string
	Cmd        []string
	Env        []string
	Cwd        string
	UID, GID   uint32
}

// TemplateDefaults finds a template's image defaults; ok is false when it
// has none (a template built from a tree or a recipe, the busybox one).
// ctld reads them from its block store with the node key, so every
// client's claims get them, whoever may read the key.
type TemplateDefaults interface {
	Defaults(ctx context.Context, template string) (d ImageDefaults, ok bool, err error)
}

// applyImageDefaults fills what req's process leaves unset from its
// template image's config (withImageDefaults). A template whose defaults
// cannot be read fails the claim: it must not start as root with another
// command by mistake.
func (n *Node) applyImageDefaults(ctx context.Context, req *journal.ClaimRequest) error {
	if n.d.ImageDefaults == nil || req.RootFS.Template == "" {
		return nil
	}
	d, ok, err := n.d.ImageDefaults.Defaults(ctx, req.RootFS.Template)
	if err != nil {
		return errdefs.Errorf(errdefs.CodeUnavailable, "read the image defaults of template %s: %v", req.RootFS.Template, err)
	}
	if ok {
		req.Process = withImageDefaults(req.Process, d)
	}
	return nil
}

// withImageDefaults is p with what it leaves unset taken from the image,
// each part on its own: no args runs the entrypoint with the cmd (args
// replace both: the claim names the whole command); the env is the
// image's with p's variables added or replacing theirs; no cwd is the
// image's working dir; no user (UserSet false, uid and gid 0) is the
// image's user. The result shares no slice with d.
func withImageDefaults(p journal.Process, d ImageDefaults) journal.Process {
	if len(p.Args) == 0 {
		p.Args = append(slices.Clone(d.Entrypoint), d.Cmd...)
		if len(p.Args) == 0 {
			p.Args = nil
		}
	}
	p.Env = mergeEnv(d.Env, p.Env)
	if p.Cwd == "" {
		p.Cwd = d.Cwd
	}
	if !p.UserSet && p.UID == 0 && p.GID == 0 {
		p.UID, p.GID = d.UID, d.GID
	}
	return p
}

// mergeEnv is base with over's variables added or replacing base's of the
// same name, base's order first.
func mergeEnv(base, over []string) []string {
	if len(base) == 0 {
		return over
	}
	out := slices.Clone(base)
	for _, kv := range over {
		k, _, _ := strings.Cut(kv, "=")
		i := slices.IndexFunc(out, func(b string) bool { bk, _, _ := strings.Cut(b, "="); return bk == k })
		if i >= 0 {
			out[i] = kv
		} else {
			out = append(out, kv)
		}
	}
	return out
}
