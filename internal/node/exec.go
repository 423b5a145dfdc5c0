package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/node/journal"
	"github.com/ctld/ctld/internal/rootfs"
	"github.com/ctld/ctld/internal/runsc"
)

func (n *Node) ready(id string) (journal.Sandbox, error) {
	s, err := n.sandbox(id)
	if err != nil {
		return s, err
	}
	if s.State != journal.StateReady {
		return s, errdefs.Errorf(errdefs.CodeConflict, "sandbox %q generation %d is %s, not ready", id, s.Generation, s.State)
	}
	return s, nil
}

// workloadUser is the uid and gid of the sandbox's main process, as its
// claim asked for them: what an exec runs as unless it names a user.
func workloadUser(s journal.Sandbox) (uid, gid uint32) {
	if s.Request == nil {
		return 0, 0
	}
	return s.Request.Process.UID, s.Request.Process.GID
}

// execProcess is what runsc exec runs for req in sandbox s: as req's user,
// or else as the workload's, never as root by default.
func execProcess(s journal.Sandbox, req api.ExecRequest) runsc.ExecProcess {
	uid, gid := workloadUser(s)
	if req.User != nil {
		uid, gid = req.User.UID, req.User.GID
	}
	return runsc.ExecProcess{Args: req.Args, Env: req.Env, Cwd: req.Cwd, UID: uid, GID: gid}
}

// Exec runs a command in the sandbox's guest through runsc exec.
func (n *Node) Exec(ctx context.Context, id string, req api.ExecRequest, stdout, stderr io.Writer) (int, error) {
	ctx, done, err := n.begin(ctx)
	if err != nil {
		return -1, err
	}
	defer done()
	s, err := n.ready(id)
	if err != nil {
		return -1, err
	}
	if req.TimeoutSec > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.TimeoutSec)*time.Second)
		defer cancel()
	}
	var stdin io.Reader
	if len(req.Stdin) > 0 {
		stdin = bytes.NewReader(req.Stdin)
	}
	// runsc exec runs in the sandbox's lease, charged to the sandbox like
	// the rest of its processes.
	p := execProcess(s, req)
	if p.CgroupDir = n.d.Leases.Dir(s.LeaseID); p.CgroupDir == "" {
		return -1, errdefs.Errorf(errdefs.CodeInternal, "exec in %s: no lease cgroup %q", id, s.LeaseID)
	}
	code, err := n.d.Runtime.Exec(ctx, s.ContainerID, p, stdin, stdout, stderr)
	if err != nil {
		if ctx.Err() != nil {
			return -1, errdefs.Errorf(errdefs.CodeUnavailable, "exec in %s: %v", id, ctx.Err())
		}
		return -1, errdefs.Errorf(errdefs.CodeInternal, "exec in %s: %v", id, err)
	}
	return code, nil
}

// ReadFile reads a regular file of the sandbox's root, resolved inside the
// root. Anything else at the path (directory, FIFO, socket, device) is
// refused without being opened.
func (n *Node) ReadFile(ctx context.Context, id, path string, limit int64) ([]byte, error) {
	s, err := n.ready(id)
	if err != nil {
		return nil, err
	}
	f, err := rootfs.OpenRegularInRoot(s.Root, path, os.O_RDONLY, 0)
	if err != nil {
		return nil, fileErr("open", path, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fileErr("read", path, err)
	}
	if int64(len(b)) > limit {
		return nil, errdefs.Errorf(errdefs.CodeInvalidArgument, "file %s exceeds %d bytes", path, limit)
	}
	return b, nil
}

// WriteFile writes (creating or truncating) a regular file of the
// sandbox's root, resolved inside the root. The parent directory must
// exist; anything but a regular file at the path is refused.
func (n *Node) WriteFile(ctx context.Context, id, path string, data []byte) error {
	_, done, err := n.begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	s, err := n.ready(id)
	if err != nil {
		return err
	}
	if err := n.live(); err != nil {
		return journalErr("write file", err)
	}
	f, err := rootfs.OpenRegularInRoot(s.Root, path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fileErr("open", path, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fileErr("write", path, err)
	}
	if err := f.Close(); err != nil {
		return fileErr("close", path, err)
	}
	return nil
}

func fileErr(verb, path string, err error) error {
	switch {
	case errors.Is(err, os.ErrNotExist) || errors.Is(err, rootfs.ErrParentMissing):
		return errdefs.Errorf(errdefs.CodeNotFound, "%s %s: %v", verb, path, err)
	case errors.Is(err, rootfs.ErrNotRegular):
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "%s %s: %v: the file API serves regular files only", verb, path, err)
	case errors.Is(err, os.ErrPermission):
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "%s %s: %v", verb, path, err)
	}
	return errdefs.Errorf(errdefs.CodeInvalidArgument, "%s %s: %v", verb, path, fmt.Errorf("%w", err))
}
