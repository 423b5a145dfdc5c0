package api

import (
	"context"
	"fmt"
	"net/http"

	"github.com/ctld/ctld/internal/names"
)

// Durable block RootFS (issue 10): a block-mode sandbox's files are a
// chain of committed generations in the node's block store. Its head is
// where the next claim of the sandbox starts (a resume); a pause seals the
// running generation, publishes it as the head and releases the compute; a
// snapshot seals it while the guest runs and names the generation; a fork
// or restore starts an identity on a committed generation.

// VolumeHead is a sandbox volume's published head.
type VolumeHead struct {
	// Seq counts the volume's publishes (1, 2, ...); 0: no head.
	Seq uint64 `json:"seq"`
	// Generation is the committed block generation a resume starts from.
	Generation uint64 `json:"generation"`
	// WriterEpoch is the epoch of the writer that sealed it; a publish of
	// an older epoch, or over another head than it started from, is
	// refused as fenced.
	WriterEpoch uint64 `json:"writer_epoch"`
	Node        string `json:"node,omitempty"`
}

// SealResult is what a seal committed and what it cost.
type SealResult struct {
	// Generation is the block generation the seal committed; Parent the
	// generation it wrote over ("sandboxes/ID@N" or "templates/NAME@0").
	Generation uint64 `json:"generation"`
	Parent     string `json:"parent"`
	// Chunks the seal wrote (data and zero), and the data bytes.
	Chunks     int   `json:"chunks"`
	DataChunks int   `json:"data_chunks"`
	ZeroChunks int   `json:"zero_chunks"`
	Bytes      int64 `json:"bytes"`
	// FreezeMS is how long the guest's filesystem was frozen (its write
	// barrier); SealMS the writer's seal; TotalMS the whole call.
	FreezeMS  float64 `json:"freeze_ms"`
	BarrierMS float64 `json:"barrier_ms"`
	SealMS    float64 `json:"seal_ms"`
	TotalMS   float64 `json:"total_ms"`
}

// PauseRequest asks to seal a block-mode sandbox's running generation,
// publish it as the sandbox's head, and release the generation.
type PauseRequest struct {
	OperationID string `json:"operation_id"`
	// Generation, when set, must be the running generation (fenced
	// otherwise).
	Generation uint64 `json:"generation,omitempty"`
}

// PauseResponse answers a pause: the head the next claim resumes from,
// the seal, and the release's cleanup proof.
type PauseResponse struct {
	Sandbox Sandbox      `json:"sandbox"`
	Head    VolumeHead   `json:"head"`
	Seal    SealResult   `json:"seal"`
	Proof   CleanupProof `json:"proof"`
}

// SnapshotRequest asks to seal the running generation while the guest
// keeps running and to name the committed generation.
type SnapshotRequest struct {
	Name string `json:"name"`
}

// Snapshot is a named committed generation of a sandbox volume.
type Snapshot struct {
	Name       string `json:"name"`
	Generation uint64 `json:"generation"`
}

// SnapshotResponse answers a snapshot.
type SnapshotResponse struct {
	Snapshot Snapshot   `json:"snapshot"`
	Seal     SealResult `json:"seal"`
}

// VolumeInfo answers GET /v1/sandboxes/{id}/volume: the sandbox volume's
// head, its snapshots and its committed generations.
type VolumeInfo struct {
	Sandbox     string     `json:"sandbox"`
	Head        VolumeHead `json:"head"`
	Snapshots   []Snapshot `json:"snapshots"`
	Generations []uint64   `json:"generations"`
}

// ForkRequest makes the sandbox of the URL a new identity whose files are
// the source sandbox's committed generation: its snapshot Snapshot, or
// without one its head. O(1) in the disk size: nothing is copied.
type ForkRequest struct {
	Source   string `json:"source"`
	Snapshot string `json:"snapshot,omitempty"`
}

// RestoreRequest moves a sandbox's head (no generation running) to its
// snapshot Snapshot: the next claim starts from it.
type RestoreRequest struct {
	Snapshot string `json:"snapshot"`
}

// Validate checks the request's names.
func (r SnapshotRequest) Validate() error { return checkSnapshotName(r.Name) }

// Validate checks the request's names.
func (r ForkRequest) Validate() error {
	if err := names.CheckID("source sandbox id", r.Source); err != nil {
		return err
	}
	if r.Snapshot == "" {
		return nil
	}
	return checkSnapshotName(r.Snapshot)
}

// Validate checks the request's names.
func (r RestoreRequest) Validate() error { return checkSnapshotName(r.Snapshot) }

// checkSnapshotName: a sandbox-id-like name (it becomes a store key segment).
func checkSnapshotName(name string) error {
	return names.CheckID("snapshot name", name)
}

// Pause seals the sandbox's running generation as its head and releases it.
func (c *Client) Pause(ctx context.Context, id string, r PauseRequest) (PauseResponse, error) {
	var out PauseResponse
	return out, c.callSandbox(ctx, http.MethodPost, id, "pause", r, &out)
}

// Snapshot seals the running generation under a name; the guest keeps running.
func (c *Client) Snapshot(ctx context.Context, id string, r SnapshotRequest) (SnapshotResponse, error) {
	var out SnapshotResponse
	return out, c.callSandbox(ctx, http.MethodPost, id, "snapshot", r, &out)
}

// Volume returns the sandbox volume's head, snapshots and generations.
func (c *Client) Volume(ctx context.Context, id string) (VolumeInfo, error) {
	var out VolumeInfo
	return out, c.callSandbox(ctx, http.MethodGet, id, "volume", nil, &out)
}

// Fork makes id a new sandbox identity on the source's committed generation.
func (c *Client) Fork(ctx context.Context, id string, r ForkRequest) (VolumeInfo, error) {
	var out VolumeInfo
	return out, c.callSandbox(ctx, http.MethodPost, id, "fork", r, &out)
}

// Restore moves the sandbox's head to one of its snapshots.
func (c *Client) Restore(ctx context.Context, id string, r RestoreRequest) (VolumeInfo, error) {
	var out VolumeInfo
	return out, c.callSandbox(ctx, http.MethodPost, id, "restore", r, &out)
}

func (c *Client) callSandbox(ctx context.Context, method, id, what string, in, out any) error {
	p, err := sandboxPath(id, what)
	if err != nil {
		return err
	}
	if err := c.call(ctx, method, p, in, out); err != nil {
		return fmt.Errorf("%s %s: %w", what, id, err)
	}
	return nil
}

// Validate checks the operation id (the generation is optional).
func (r PauseRequest) Validate() error { return ValidateOperationID(r.OperationID) }
