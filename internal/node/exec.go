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
	"github.com/ctld/ctld/internal/rootfs"
	"github.com/ctld/ctld/internal/runtime"
)

func (n *Node) ready(id string) (string, string, error) {
	s, err := n.sandbox(id)
	if err != nil {
		return "", "", err
	}
	if s.State != api.StateReady {
		return "", "", api.Errorf(api.CodeConflict, "sandbox %q generation %d is %s, not ready", id, s.Generation, s.State)
	}
	return s.ContainerID, s.Root, nil
}

// Exec runs a command in the sandbox's guest through runsc exec.
func (n *Node) Exec(ctx context.Context, id string, req api.ExecRequest, stdout, stderr io.Writer) (int, error) {
	cid, _, err := n.ready(id)
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
	code, err := n.d.Runtime.Exec(ctx, cid, runtime.ExecProcess{Args: req.Args, Env: req.Env, Cwd: req.Cwd}, stdin, stdout, stderr)
	if err != nil {
		if ctx.Err() != nil {
			return -1, api.Errorf(api.CodeUnavailable, "exec in %s: %v", id, ctx.Err())
		}
		return -1, api.Errorf(api.CodeInternal, "exec in %s: %v", id, err)
	}
	return code, nil
}

// ReadFile reads a file of the sandbox's root, resolved inside the root.
func (n *Node) ReadFile(ctx context.Context, id, path string, limit int64) ([]byte, error) {
	_, root, err := n.ready(id)
	if err != nil {
		return nil, err
	}
	f, err := rootfs.OpenInRoot(root, path, os.O_RDONLY, 0)
	if err != nil {
		return nil, fileErr("open", path, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fileErr("read", path, err)
	}
	if int64(len(b)) > limit {
		return nil, api.Errorf(api.CodeInvalidArgument, "file %s exceeds %d bytes", path, limit)
	}
	return b, nil
}

// WriteFile writes (creating or truncating) a file of the sandbox's root,
// resolved inside the root. The parent directory must exist.
func (n *Node) WriteFile(ctx context.Context, id, path string, data []byte) error {
	_, root, err := n.ready(id)
	if err != nil {
		return err
	}
	f, err := rootfs.OpenInRoot(root, path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
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
		return api.Errorf(api.CodeNotFound, "%s %s: %v", verb, path, err)
	case errors.Is(err, os.ErrPermission):
		return api.Errorf(api.CodeInvalidArgument, "%s %s: %v", verb, path, err)
	}
	return api.Errorf(api.CodeInvalidArgument, "%s %s: %v", verb, path, fmt.Errorf("%w", err))
}
