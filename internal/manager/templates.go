package manager

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/ctld/ctld/internal/api"
)

// ImageDefaults is how a template's image asks to be run (its config's
// entrypoint, cmd, env, user resolved in the image, working dir): the
// defaults of a claim of that template.
type ImageDefaults struct {
	Entrypoint []string
	Cmd        []string
	Env        []string
	Cwd        string
	UID, GID   uint32
}

// TemplateDefaults finds the image defaults of a claim's template; ok is
// false when it has none (a template built from a tree, the busybox one).
// An error fails the claim: a template whose defaults cannot be read must
// not start as root with no command by mistake.
type TemplateDefaults interface {
	Defaults(ctx context.Context, rootfs api.RootFS) (d ImageDefaults, ok bool, err error)
}

// withDefaults is the spec with what it leaves unset taken from the
// image, each part on its own: no args runs the entrypoint with the cmd
// (args replace both: the claim names the whole command); the env is the
// image's with the claim's variables added or replacing theirs; no cwd is
// the image's working dir; no user (Spec.User nil and Process uid and gid
// 0) is the image's user.
func (s Spec) withDefaults(d ImageDefaults) Spec {
	p := s.Process
	if len(p.Args) == 0 {
		p.Args = append(slices.Clone(d.Entrypoint), d.Cmd...)
	}
	p.Env = mergeEnv(d.Env, p.Env)
	if p.Cwd == "" {
		p.Cwd = d.Cwd
	}
	switch {
	case s.User != nil:
		p.UID, p.GID = s.User.UID, s.User.GID
	case p.UID == 0 && p.GID == 0:
		p.UID, p.GID = d.UID, d.GID
	}
	s.Process = p
	return s
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

// applyDefaults fills spec from its template's image, when the manager
// knows template defaults and the template has some.
func (m *Manager) applyDefaults(ctx context.Context, spec Spec) (Spec, error) {
	if m.Templates != nil {
		d, ok, err := m.Templates.Defaults(ctx, spec.RootFS)
		if err != nil {
			return spec, fmt.Errorf("read defaults of template %s: %w", spec.RootFS.Template, err)
		}
		if ok {
			return spec.withDefaults(d), nil
		}
	}
	if spec.User != nil {
		spec.Process.UID, spec.Process.GID = spec.User.UID, spec.User.GID
	}
	return spec, nil
}
