package api

import (
	"context"
	"io"
)

// Service is what the API server serves; internal/node implements it. Its
// errors should be *errdefs.Error (see errors.go) so the server can map them to a
// code; any other error is reported as internal.
type Service interface {
	Node(ctx context.Context) (Node, error)
	Claim(ctx context.Context, id string, req ClaimRequest) (ClaimResponse, error)
	// Exec runs a command in the sandbox, writing its output to stdout and
	// stderr as it comes, and returns its exit code.
	Exec(ctx context.Context, id string, req ExecRequest, stdout, stderr io.Writer) (int, error)
	ReadFile(ctx context.Context, id, path string, limit int64) ([]byte, error)
	WriteFile(ctx context.Context, id, path string, data []byte) error
	Release(ctx context.Context, id string, req ReleaseRequest) (ReleaseResponse, error)
	List(ctx context.Context) (SandboxList, error)
	Get(ctx context.Context, id string) (Sandbox, error)
	Proof(ctx context.Context, operationID string) (CleanupProof, error)
	// Logs writes the sandbox's log to w (and with req.Follow what comes
	// after, as it comes) and says why it ended. req is validated.
	Logs(ctx context.Context, id string, req LogsRequest, w io.Writer) (LogsEnd, error)
}
