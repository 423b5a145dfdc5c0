package manager

import "context"

// applyDefaults settles the claim's user: Spec.User, when set, is the
// main process's user, root included (Process.UserSet). What the claim
// leaves unset (command, env by variable, cwd, user) ctld fills from its
// template image's config: it reads the image's recorded config with the
// node key, which a non-root client may not read.
func (m *Manager) applyDefaults(_ context.Context, spec Spec) (Spec, error) {
	if spec.User != nil {
		spec.Process.UID, spec.Process.GID, spec.Process.UserSet = spec.User.UID, spec.User.GID, true
	}
	return spec, nil
}
