package manager

import (
	"context"
	"errors"
	"io"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/names"
)

// The guest agent's calls pass through to the node as they are: the
// manager records nothing for them (they change no lifecycle state).

// Session runs a command with streamed stdin (and a PTY when req.TTY); see
// api.Client.Session. A busy node's refusal is not retried: stdin already
// read for the refused try would be lost.
func (m *Manager) Session(ctx context.Context, id string, req api.ExecRequest, s api.Streams) (api.ExecExit, error) {
	if err := names.CheckID("sandbox id", id); err != nil {
		return api.ExecExit{}, err
	}
	if err := req.ValidateSession(); err != nil {
		return api.ExecExit{}, err
	}
	c, err := m.client(ctx, id)
	if err != nil {
		return api.ExecExit{}, err
	}
	return c.Session(ctx, id, req, s)
}

// ExecViaRunsc is Exec through `runsc exec` (the operator's fallback when
// the guest agent does not answer).
func (m *Manager) ExecViaRunsc(ctx context.Context, id string, req api.ExecRequest, stdout, stderr io.Writer) (int, error) {
	if err := names.CheckID("sandbox id", id); err != nil {
		return 0, err
	}
	if err := req.Validate(); err != nil {
		return 0, err
	}
	c, err := m.client(ctx, id)
	if err != nil {
		return 0, err
	}
	var code int
	err = m.whileBusy(ctx, "exec via runsc in "+id, func() (err error) {
		code, err = c.ExecViaRunsc(ctx, id, req, stdout, stderr)
		return err
	})
	return code, err
}

func checkFile(id, p string, u *api.User) error {
	return errors.Join(names.CheckID("sandbox id", id), api.ValidateFilePath(p), api.ValidateUser(u))
}

// StatFile returns what the guest sees at path.
func (m *Manager) StatFile(ctx context.Context, id, p string, u *api.User) (api.FileInfo, error) {
	if err := checkFile(id, p, u); err != nil {
		return api.FileInfo{}, err
	}
	c, err := m.client(ctx, id)
	if err != nil {
		return api.FileInfo{}, err
	}
	return c.StatFile(ctx, id, p, u)
}

// ListDir returns the entries of a directory in the guest.
func (m *Manager) ListDir(ctx context.Context, id, p string, u *api.User) ([]api.FileInfo, error) {
	if err := checkFile(id, p, u); err != nil {
		return nil, err
	}
	c, err := m.client(ctx, id)
	if err != nil {
		return nil, err
	}
	return c.ListDir(ctx, id, p, u)
}

// MakeDir makes a directory in the guest.
func (m *Manager) MakeDir(ctx context.Context, id, p string, mode uint32, parents bool, u *api.User) error {
	if err := errors.Join(names.CheckID("sandbox id", id), api.MkdirRequest{Path: p, Mode: mode, Parents: parents, User: u}.Validate()); err != nil {
		return err
	}
	c, err := m.client(ctx, id)
	if err != nil {
		return err
	}
	return c.MakeDir(ctx, id, p, mode, parents, u)
}

// RemoveFile removes a file or directory in the guest.
func (m *Manager) RemoveFile(ctx context.Context, id, p string, recursive bool, u *api.User) error {
	if err := errors.Join(names.CheckID("sandbox id", id), api.RemoveRequest{Path: p, Recursive: recursive, User: u}.Validate()); err != nil {
		return err
	}
	c, err := m.client(ctx, id)
	if err != nil {
		return err
	}
	return c.RemoveFile(ctx, id, p, recursive, u)
}

// RenameFile renames a file or directory in the guest.
func (m *Manager) RenameFile(ctx context.Context, id, from, to string, u *api.User) error {
	if err := errors.Join(names.CheckID("sandbox id", id), api.RenameRequest{From: from, To: to, User: u}.Validate()); err != nil {
		return err
	}
	c, err := m.client(ctx, id)
	if err != nil {
		return err
	}
	return c.RenameFile(ctx, id, from, to, u)
}

// ReadFileTo streams a file of the guest to w.
func (m *Manager) ReadFileTo(ctx context.Context, id, p string, u *api.User, w io.Writer) (int64, error) {
	if err := checkFile(id, p, u); err != nil {
		return 0, err
	}
	c, err := m.client(ctx, id)
	if err != nil {
		return 0, err
	}
	return c.ReadFileTo(ctx, id, p, u, w)
}

// WriteFileFrom streams r into a file of the guest (size: r's length, -1
// when unknown).
func (m *Manager) WriteFileFrom(ctx context.Context, id, p string, u *api.User, mode uint32, r io.Reader, size int64) error {
	if err := errors.Join(checkFile(id, p, u), api.ValidateFileMode(mode)); err != nil {
		return err
	}
	c, err := m.client(ctx, id)
	if err != nil {
		return err
	}
	return c.WriteFileFrom(ctx, id, p, u, mode, r, size)
}
