package apiserver

import (
	"context"
	"encoding/json"
	"io"

	"github.com/ctld/ctld/internal/agent/client"
	"github.com/ctld/ctld/internal/agent/wire"
	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/node"
)

// Adapter serves the node N through the Service. Each call converts the
// validated wire request to the node's domain types (convert.go), makes
// one call and converts the answer back; the node never sees a wire
// type. Its errors pass through unchanged: they carry their errdefs kind,
// which the server maps to a status once (answerError). The node must be
// built with Answers, so the answers it stores are the wire's.
type Adapter struct {
	N *node.Node
}

var _ Service = Adapter{}

// decodeAnswer decodes an answer the node stored for an operation (Answers).
func decodeAnswer[T any](raw json.RawMessage, err error) (T, error) {
	var out T
	if err != nil {
		return out, err
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return out, errdefs.Errorf(errdefs.CodeInternal, "decode the stored answer: %v", err)
	}
	return out, nil
}

// Sandboxes.

func (a Adapter) Node(ctx context.Context) (api.Node, error) {
	info, err := a.N.Node(ctx)
	if err != nil {
		return api.Node{}, err
	}
	return apiNode(info), nil
}

func (a Adapter) Claim(ctx context.Context, id string, req api.ClaimRequest) (api.ClaimResponse, error) {
	return decodeAnswer[api.ClaimResponse](a.N.Claim(ctx, id, claimRecord(req)))
}

func (a Adapter) Release(ctx context.Context, id string, req api.ReleaseRequest) (api.ReleaseResponse, error) {
	return decodeAnswer[api.ReleaseResponse](a.N.Release(ctx, id, node.ReleaseRequest{OperationID: req.OperationID, Generation: req.Generation}))
}

func (a Adapter) UpdateNetwork(ctx context.Context, id string, p api.NetworkPolicy) (api.Sandbox, error) {
	v, err := a.N.UpdateNetwork(ctx, id, networkRecord(p))
	if err != nil {
		return api.Sandbox{}, err
	}
	return apiView(v), nil
}

func (a Adapter) List(ctx context.Context) (api.SandboxList, error) {
	vs, err := a.N.List(ctx)
	if err != nil {
		return api.SandboxList{}, err
	}
	out := api.SandboxList{Sandboxes: make([]api.Sandbox, len(vs))}
	for i, v := range vs {
		out.Sandboxes[i] = apiView(v)
	}
	return out, nil
}

func (a Adapter) Get(ctx context.Context, id string) (api.Sandbox, error) {
	v, err := a.N.Get(ctx, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	return apiView(v), nil
}

func (a Adapter) Proof(ctx context.Context, operationID string) (api.CleanupProof, error) {
	p, err := a.N.Proof(ctx, operationID)
	if err != nil {
		return api.CleanupProof{}, err
	}
	return api.CleanupProofOf(p), nil
}

// Logs ends a follow when the server serving ctx begins to shut down.
func (a Adapter) Logs(ctx context.Context, id string, req api.LogsRequest, w io.Writer) (api.LogsEnd, error) {
	end, err := a.N.Logs(ctx, id, node.LogsRequest{Runsc: req.Source == api.LogSourceRunsc, Tail: req.Tail,
		Follow: req.Follow, IdleSec: req.IdleSec, Shutdown: api.ShuttingDown(ctx)}, w)
	return api.LogsEnd{Generation: end.Generation, Reason: end.Reason}, err
}

// Volumes.

func (a Adapter) Pause(ctx context.Context, id string, req api.PauseRequest) (api.PauseResponse, error) {
	return decodeAnswer[api.PauseResponse](a.N.Pause(ctx, id, node.PauseRequest{OperationID: req.OperationID, Generation: req.Generation}))
}

func (a Adapter) Snapshot(ctx context.Context, id string, req api.SnapshotRequest) (api.SnapshotResponse, error) {
	snap, res, err := a.N.Snapshot(ctx, id, req.Name)
	if err != nil {
		return api.SnapshotResponse{}, err
	}
	return api.SnapshotResponse{Snapshot: api.Snapshot(snap), Seal: api.SealResult(res)}, nil
}

func (a Adapter) Volume(ctx context.Context, id string) (api.VolumeInfo, error) {
	return apiVolume(a.N.Volume(ctx, id))
}

func (a Adapter) Fork(ctx context.Context, id string, req api.ForkRequest) (api.VolumeInfo, error) {
	return apiVolume(a.N.Fork(ctx, id, node.ForkRequest{Source: req.Source, Snapshot: req.Snapshot}))
}

func (a Adapter) Restore(ctx context.Context, id string, req api.RestoreRequest) (api.VolumeInfo, error) {
	return apiVolume(a.N.Restore(ctx, id, req.Snapshot))
}

// Guest.

func (a Adapter) Exec(ctx context.Context, id string, req api.ExecRequest, stdout, stderr io.Writer) (int, error) {
	return a.N.Exec(ctx, id, execRecord(req), stdout, stderr)
}

// Session converts the caller's resizes as they come.
func (a Adapter) Session(ctx context.Context, id string, req api.ExecRequest, s api.Streams) (api.ExecExit, error) {
	cs := client.Streams{Stdin: s.Stdin, Stdout: s.Stdout, Stderr: s.Stderr, Signal: s.Signal}
	if s.Resize != nil {
		rs := make(chan wire.Resize)
		cs.Resize = rs
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			for {
				select {
				case <-stop:
					return
				case t, ok := <-s.Resize:
					if !ok {
						close(rs)
						return
					}
					select {
					case rs <- wire.Resize{Rows: t.Rows, Cols: t.Cols}:
					case <-stop:
						return
					}
				}
			}
		}()
	}
	e, err := a.N.Session(ctx, id, execRecord(req), cs)
	return api.ExecExit{ExitCode: e.Code, Signal: e.Signal, TimedOut: e.TimedOut}, err
}

func (a Adapter) ExecViaRunsc(ctx context.Context, id string, req api.ExecRequest, stdout, stderr io.Writer) (int, error) {
	return a.N.ExecViaRunsc(ctx, id, execRecord(req), stdout, stderr)
}

func (a Adapter) ReadFile(ctx context.Context, id, path string, limit int64) ([]byte, error) {
	return a.N.ReadFile(ctx, id, path, limit)
}

func (a Adapter) WriteFile(ctx context.Context, id, path string, data []byte) error {
	return a.N.WriteFile(ctx, id, path, data)
}

func (a Adapter) StatFile(ctx context.Context, id, path string, user *api.User) (api.FileInfo, error) {
	st, err := a.N.StatFile(ctx, id, path, guestUser(user))
	if err != nil {
		return api.FileInfo{}, err
	}
	return apiFileInfo(st), nil
}

func (a Adapter) ListDir(ctx context.Context, id, path string, user *api.User) ([]api.FileInfo, error) {
	sts, err := a.N.ListDir(ctx, id, path, guestUser(user))
	if err != nil {
		return nil, err
	}
	out := make([]api.FileInfo, len(sts))
	for i, st := range sts {
		out[i] = apiFileInfo(st)
	}
	return out, nil
}

func (a Adapter) MakeDir(ctx context.Context, id, path string, mode uint32, parents bool, user *api.User) error {
	return a.N.MakeDir(ctx, id, path, mode, parents, guestUser(user))
}

func (a Adapter) RemoveFile(ctx context.Context, id, path string, recursive bool, user *api.User) error {
	return a.N.RemoveFile(ctx, id, path, recursive, guestUser(user))
}

func (a Adapter) RenameFile(ctx context.Context, id, from, to string, user *api.User) error {
	return a.N.RenameFile(ctx, id, from, to, guestUser(user))
}

func (a Adapter) ReadFileTo(ctx context.Context, id, path string, user *api.User, limit int64, w io.Writer) (int64, error) {
	return a.N.ReadFileTo(ctx, id, path, guestUser(user), limit, w)
}

func (a Adapter) WriteFileFrom(ctx context.Context, id, path string, user *api.User, mode uint32, limit int64, r io.Reader) (int64, error) {
	return a.N.WriteFileFrom(ctx, id, path, guestUser(user), mode, limit, r)
}
