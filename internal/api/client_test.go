package api

import (
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/ctld/ctld/internal/errdefs"
)

func TestClientZeroValueUsesDefaultSocket(t *testing.T) {
	var c Client
	if got := c.socketPath(); got != DefaultSocketPath {
		t.Fatalf("zero Client socket = %q, want %q", got, DefaultSocketPath)
	}
	if _, err := os.Stat(DefaultSocketPath); err == nil {
		// A live ctld on this machine would answer; the path check above
		// already proved the target.
		return
	}
	_, err := c.Node(context.Background())
	if errdefs.CodeOf(err) != errdefs.CodeUnavailable || !strings.Contains(err.Error(), DefaultSocketPath) || !errors.Is(err, syscall.ENOENT) {
		t.Errorf("zero Client Node() = %v, want unavailable naming %s and wrapping ENOENT", err, DefaultSocketPath)
	}
}

func TestClientUnreachable(t *testing.T) {
	dir := t.TempDir()
	c := Client{SocketPath: dir + "/none.sock"}
	_, err := c.Node(context.Background())
	if errdefs.CodeOf(err) != errdefs.CodeUnavailable || !errors.Is(err, syscall.ENOENT) {
		t.Errorf("Node() on a missing socket = %v, want unavailable wrapping ENOENT", err)
	}
}
