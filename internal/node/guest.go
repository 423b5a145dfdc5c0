package node

import (
	"context"
	"io"

	"github.com/ctld/ctld/internal/agent/client"
	"github.com/ctld/ctld/internal/agent/wire"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/guest"
	"github.com/ctld/ctld/internal/node/overlay"
)

// The guest and overlay concerns' names the node's callers (cmd/ctld, the
// API adapter) use; the node's public guest calls delegate to the guest
// concern (internal/node/guest).
type (
	ExecRequest    = guest.ExecRequest
	LogsRequest    = guest.LogsRequest
	LogsEnd        = guest.LogsEnd
	TmpfsAgentDirs = guest.TmpfsAgentDirs
	ProcPeers      = guest.ProcPeers
	DiskProjects   = overlay.DiskProjects
)

const (
	DefaultReadyTimeout = guest.DefaultReadyTimeout
	DefaultRuntimePIDs  = guest.DefaultRuntimePIDs
	MaxRuntimePIDs      = guest.MaxRuntimePIDs
)

// DefaultDiskProjects is overlay.DefaultDiskProjects.
var DefaultDiskProjects = overlay.DefaultDiskProjects

// ready is sandbox id's record if its generation is ready.
func (n *Node) ready(id string) (journal.Sandbox, error) { return n.guest.ReadySandbox(id) }

// Exec runs a command in the sandbox's guest through its agent (guest.Exec).
func (n *Node) Exec(ctx context.Context, id string, req ExecRequest, stdout, stderr io.Writer) (int, error) {
	return n.guest.Exec(ctx, id, req, stdout, stderr)
}

// Session runs a streamed command through the sandbox's agent (guest.Session).
func (n *Node) Session(ctx context.Context, id string, req ExecRequest, s client.Streams) (wire.Exit, error) {
	return n.guest.Session(ctx, id, req, s)
}

// ExecViaRunsc is Exec through `runsc exec` (guest.ExecViaRunsc).
func (n *Node) ExecViaRunsc(ctx context.Context, id string, req ExecRequest, stdout, stderr io.Writer) (int, error) {
	return n.guest.ExecViaRunsc(ctx, id, req, stdout, stderr)
}

// StatFile stats a guest file (guest.StatFile).
func (n *Node) StatFile(ctx context.Context, id, p string, user *wire.User) (wire.Stat, error) {
	return n.guest.StatFile(ctx, id, p, user)
}

// ListDir lists a guest directory (guest.ListDir).
func (n *Node) ListDir(ctx context.Context, id, p string, user *wire.User) ([]wire.Stat, error) {
	return n.guest.ListDir(ctx, id, p, user)
}

// MakeDir makes a guest directory (guest.MakeDir).
func (n *Node) MakeDir(ctx context.Context, id, p string, mode uint32, parents bool, user *wire.User) error {
	return n.guest.MakeDir(ctx, id, p, mode, parents, user)
}

// RemoveFile removes a guest file (guest.RemoveFile).
func (n *Node) RemoveFile(ctx context.Context, id, p string, recursive bool, user *wire.User) error {
	return n.guest.RemoveFile(ctx, id, p, recursive, user)
}

// RenameFile renames a guest file (guest.RenameFile).
func (n *Node) RenameFile(ctx context.Context, id, from, to string, user *wire.User) error {
	return n.guest.RenameFile(ctx, id, from, to, user)
}

// ReadFileTo streams a guest file to w (guest.ReadFileTo).
func (n *Node) ReadFileTo(ctx context.Context, id, p string, user *wire.User, limit int64, w io.Writer) (int64, error) {
	return n.guest.ReadFileTo(ctx, id, p, user, limit, w)
}

// WriteFileFrom replaces a guest file with r (guest.WriteFileFrom).
func (n *Node) WriteFileFrom(ctx context.Context, id, p string, user *wire.User, mode uint32, limit int64, r io.Reader) (int64, error) {
	return n.guest.WriteFileFrom(ctx, id, p, user, mode, limit, r)
}

// ReadFile reads a guest file whole (guest.ReadFile).
func (n *Node) ReadFile(ctx context.Context, id, p string, limit int64) ([]byte, error) {
	return n.guest.ReadFile(ctx, id, p, limit)
}

// WriteFile replaces a guest file with data (guest.WriteFile).
func (n *Node) WriteFile(ctx context.Context, id, p string, data []byte) error {
	return n.guest.WriteFile(ctx, id, p, data)
}

// Logs writes the current generation's log to w (guest.Logs).
func (n *Node) Logs(ctx context.Context, id string, req LogsRequest, w io.Writer) (LogsEnd, error) {
	return n.guest.Logs(ctx, id, req, w)
}
