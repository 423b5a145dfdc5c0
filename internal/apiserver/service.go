// Package apiserver serves an apiserver.Service over HTTP/1.1 + JSON on a
// Unix socket: the routes under /v1, peer credentials per connection,
// strict JSON and size limits, server-sent event streams, concurrency
// limits, and the mapping of error kinds (package errdefs) to HTTP
// statuses. The wire types and the client are package api. Adapter
// (adapter.go) serves the node (internal/node) through the Service: it
// converts the wire types to the node's domain types and back.
package apiserver

import (
	"context"
	"io"

	"github.com/ctld/ctld/internal/api"
)

// Service is what the API server serves: the sandboxes' lifecycle, their
// durable volumes and their guests. Adapter implements it over the node,
// the manager's fake node (internal/manager/fakenode) over memory. Its
// errors should be *errdefs.Error (or wrap one) so the server can map
// them to a code; any other error is reported as internal.
type Service interface {
	Sandboxes
	Volumes
	Guest
}

// Sandboxes is the node and its sandboxes' lifecycle: claim, release, the
// live network update, the records, the proofs and the logs. Requests
// reach it validated.
type Sandboxes interface {
	Node(ctx context.Context) (api.Node, error)
	Claim(ctx context.Context, id string, req api.ClaimRequest) (api.ClaimResponse, error)
	Release(ctx context.Context, id string, req api.ReleaseRequest) (api.ReleaseResponse, error)
	// UpdateNetwork replaces the network policy of the sandbox's running
	// generation (p is validated) and returns the sandbox as it is after.
	UpdateNetwork(ctx context.Context, id string, p api.NetworkPolicy) (api.Sandbox, error)
	List(ctx context.Context) (api.SandboxList, error)
	Get(ctx context.Context, id string) (api.Sandbox, error)
	Proof(ctx context.Context, operationID string) (api.CleanupProof, error)
	// Logs writes the sandbox's log to w (and with req.Follow what comes
	// after, as it comes) and says why it ended. req is validated.
	Logs(ctx context.Context, id string, req api.LogsRequest, w io.Writer) (api.LogsEnd, error)
}

// Volumes is the durable block RootFS (issue 10). Pause seals the running
// generation, publishes it as the sandbox's head (compare-and-swap; a
// stale writer's publish is fenced) and releases the generation. Snapshot
// seals it under a name while the guest runs. Volume reports the head,
// snapshots and generations. Fork makes id a new identity on another
// sandbox's committed generation; Restore moves id's head to one of its
// snapshots. Requests are validated.
type Volumes interface {
	Pause(ctx context.Context, id string, req api.PauseRequest) (api.PauseResponse, error)
	Snapshot(ctx context.Context, id string, req api.SnapshotRequest) (api.SnapshotResponse, error)
	Volume(ctx context.Context, id string) (api.VolumeInfo, error)
	Fork(ctx context.Context, id string, req api.ForkRequest) (api.VolumeInfo, error)
	Restore(ctx context.Context, id string, req api.RestoreRequest) (api.VolumeInfo, error)
}

// Guest is the calls that go to the guest agent of the sandbox's ready
// generation (issue 11), and the operator's runsc fallback. A nil user
// means the workload's.
type Guest interface {
	// Exec runs a command in the sandbox, writing its output to stdout and
	// stderr as it comes, and returns its exit code.
	Exec(ctx context.Context, id string, req api.ExecRequest, stdout, stderr io.Writer) (int, error)
	// Session runs a command with streamed stdin (and a PTY when req.TTY),
	// taking resizes and signals from s while it runs; the command's
	// process group is killed when ctx ends.
	Session(ctx context.Context, id string, req api.ExecRequest, s api.Streams) (api.ExecExit, error)
	// ExecViaRunsc is Exec through `runsc exec`, the operator's fallback
	// when the agent does not answer.
	ExecViaRunsc(ctx context.Context, id string, req api.ExecRequest, stdout, stderr io.Writer) (int, error)
	ReadFile(ctx context.Context, id, path string, limit int64) ([]byte, error)
	WriteFile(ctx context.Context, id, path string, data []byte) error
	StatFile(ctx context.Context, id, path string, user *api.User) (api.FileInfo, error)
	ListDir(ctx context.Context, id, path string, user *api.User) ([]api.FileInfo, error)
	MakeDir(ctx context.Context, id, path string, mode uint32, parents bool, user *api.User) error
	RemoveFile(ctx context.Context, id, path string, recursive bool, user *api.User) error
	RenameFile(ctx context.Context, id, from, to string, user *api.User) error
	// ReadFileTo streams a regular file to w, refusing (errdefs
	// invalid_argument) one larger than limit; it returns the bytes written.
	ReadFileTo(ctx context.Context, id, path string, user *api.User, limit int64, w io.Writer) (int64, error)
	// WriteFileFrom replaces path with what r holds (at most limit bytes,
	// else nothing changes) and returns the bytes written.
	WriteFileFrom(ctx context.Context, id, path string, user *api.User, mode uint32, limit int64, r io.Reader) (int64, error)
}
