package manager

import (
	"testing"

	"github.com/ctld/ctld/internal/api"
)

// Spec.User is the claim's own user, root too: ctld must not replace it
// with the template image's.
func TestApplyDefaultsUser(t *testing.T) {
	m := &Manager{}
	s, err := m.applyDefaults(t.Context(), Spec{User: &api.User{}})
	if err != nil || !s.Process.UserSet || s.Process.UID != 0 {
		t.Fatalf("root asked: %+v, %v", s.Process, err)
	}
	s, err = m.applyDefaults(t.Context(), Spec{User: &api.User{UID: 7, GID: 8}})
	if err != nil || !s.Process.UserSet || s.Process.UID != 7 || s.Process.GID != 8 {
		t.Fatalf("user 7:8: %+v, %v", s.Process, err)
	}
	if s, _ = m.applyDefaults(t.Context(), Spec{}); s.Process.UserSet {
		t.Fatalf("no user: %+v", s.Process)
	}
}
