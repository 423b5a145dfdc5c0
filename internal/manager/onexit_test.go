package manager

import (
	"testing"

	"github.com/ctld/ctld/internal/api"
)

// TestSpecCarriesOnExit: a create's on_exit reaches the node's claim
// (api's validate tests refuse a value other than keep or release).
func TestSpecCarriesOnExit(t *testing.T) {
	if req := (Spec{OnExit: api.OnExitRelease}).claim("op", 1); req.OnExit != api.OnExitRelease {
		t.Fatalf("claim on_exit %q, want %q", req.OnExit, api.OnExitRelease)
	}
}
