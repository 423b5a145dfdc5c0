package apiserver

import (
	"bytes"
	"context"
	"fmt"
	"io"

	"github.com/ctld/ctld/internal/api"
)

// agentFake is the part of fakeService that answers the guest agent's
// calls; each call is recorded, then answered by its hook or f.err.
type agentFake struct {
	session  func(ctx context.Context, req api.ExecRequest, s api.Streams) (api.ExecExit, error)
	stat     api.FileInfo
	entries  []api.FileInfo
	readTo   func(ctx context.Context, limit int64, w io.Writer) (int64, error)
	writeErr error // answered by WriteFileFrom after it read the data
	// writeFrom, when set, replaces WriteFileFrom's reading of r.
	writeFrom func(ctx context.Context, limit int64, r io.Reader) (int64, error)
}

func (f *fakeService) Session(ctx context.Context, id string, req api.ExecRequest, s api.Streams) (api.ExecExit, error) {
	f.record("Session %s %q tty=%v %dx%d", id, req.Args, req.TTY, req.Rows, req.Cols)
	if f.session != nil {
		return f.session(ctx, req, s)
	}
	return api.ExecExit{}, f.err
}

func (f *fakeService) ExecViaRunsc(ctx context.Context, id string, req api.ExecRequest, stdout, stderr io.Writer) (int, error) {
	f.record("ExecViaRunsc %s %q", id, req.Args)
	if f.exec != nil {
		return f.exec(stdout, stderr)
	}
	return 0, f.err
}

func userString(u *api.User) string {
	if u == nil {
		return "default"
	}
	return fmt.Sprintf("%d:%d", u.UID, u.GID)
}

func (f *fakeService) StatFile(ctx context.Context, id, path string, user *api.User) (api.FileInfo, error) {
	f.record("StatFile %s %s %s", id, path, userString(user))
	return f.stat, f.err
}

func (f *fakeService) ListDir(ctx context.Context, id, path string, user *api.User) ([]api.FileInfo, error) {
	f.record("ListDir %s %s %s", id, path, userString(user))
	return f.entries, f.err
}

func (f *fakeService) MakeDir(ctx context.Context, id, path string, mode uint32, parents bool, user *api.User) error {
	f.record("MakeDir %s %s %#o parents=%v %s", id, path, mode, parents, userString(user))
	return f.err
}

func (f *fakeService) RemoveFile(ctx context.Context, id, path string, recursive bool, user *api.User) error {
	f.record("RemoveFile %s %s recursive=%v %s", id, path, recursive, userString(user))
	return f.err
}

func (f *fakeService) RenameFile(ctx context.Context, id, from, to string, user *api.User) error {
	f.record("RenameFile %s %s %s %s", id, from, to, userString(user))
	return f.err
}

func (f *fakeService) ReadFileTo(ctx context.Context, id, path string, user *api.User, limit int64, w io.Writer) (int64, error) {
	f.record("ReadFileTo %s %s %s limit=%d", id, path, userString(user), limit)
	if f.readTo != nil {
		return f.readTo(ctx, limit, w)
	}
	if f.err != nil {
		return 0, f.err
	}
	n, err := w.Write(f.file)
	return int64(n), err
}

func (f *fakeService) WriteFileFrom(ctx context.Context, id, path string, user *api.User, mode uint32, limit int64, r io.Reader) (int64, error) {
	f.record("WriteFileFrom %s %s %s %#o limit=%d", id, path, userString(user), mode, limit)
	if f.writeFrom != nil {
		return f.writeFrom(ctx, limit, r)
	}
	if f.err != nil {
		return 0, f.err
	}
	var b bytes.Buffer
	n, err := io.Copy(&b, r)
	if err != nil {
		return n, err
	}
	f.mu.Lock()
	f.written = b.Bytes()
	f.mu.Unlock()
	return n, f.writeErr
}
