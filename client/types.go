// Package client is the Go client of the sandbox service (`ctl-manager
// serve`, API /v1) and its wire types. It is outside internal/ so other
// programs can import it. The OpenAPI document of the same API is served
// at /v1/openapi.json.
package client

import (
	"fmt"
	"time"
)

// Error codes of the service. Each maps to one HTTP status.
const (
	CodeInvalidArgument     = "invalid_argument"     // 400
	CodeUnauthenticated     = "unauthenticated"      // 401
	CodeNotFound            = "not_found"            // 404
	CodeMethodNotAllowed    = "method_not_allowed"   // 405
	CodeConflict            = "conflict"             // 409
	CodePayloadTooLarge     = "payload_too_large"    // 413
	CodeUnsupportedMedia    = "unsupported_media"    // 415
	CodeIdempotencyMismatch = "idempotency_mismatch" // 422
	CodeQuotaExceeded       = "quota_exceeded"       // 429
	CodeInternal            = "internal"             // 500
	CodeUnavailable         = "unavailable"          // 503, with Retry-After when busy
	CodeTimeout             = "timeout"              // 504
)

// ErrorBody is the JSON body of every error response.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is a code from the fixed set and a message for a person.
type ErrorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Error is an error answer of the service.
type Error struct {
	Status  int
	Code    string
	Message string
	// RetryAfter is the Retry-After hint, when the service sent one.
	RetryAfter time.Duration
}

func (e *Error) Error() string { return fmt.Sprintf("%s (%d): %s", e.Code, e.Status, e.Message) }

// Resources asked for a sandbox: quantities as strings ("500m" or "0.5"
// CPUs; "256Mi", "1Gi" of memory or disk).
type Resources struct {
	CPU    string `json:"cpu,omitempty"`
	Memory string `json:"memory,omitempty"`
	Disk   string `json:"disk,omitempty"`
	PIDs   int64  `json:"pids,omitempty"`
}

// NetworkRule allows one egress destination (see docs/operations.md).
type NetworkRule struct {
	CIDR     string   `json:"cidr,omitempty"`
	Domain   string   `json:"domain,omitempty"`
	Protocol string   `json:"protocol,omitempty"`
	Ports    []string `json:"ports,omitempty"`
}

// Network is a sandbox's egress policy: mode deny_all (the default), open
// or restricted with rules.
type Network struct {
	Mode  string        `json:"mode"`
	Rules []NetworkRule `json:"rules,omitempty"`
}

// User is a numeric uid and gid inside the guest.
type User struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

// CreateRequest is the body of POST /v1/sandboxes.
type CreateRequest struct {
	Template  string            `json:"template"`
	Resources *Resources        `json:"resources,omitempty"`
	Network   *Network          `json:"network,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Args      []string          `json:"args,omitempty"`
	Cwd       string            `json:"cwd,omitempty"`
	User      *User             `json:"user,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	// TimeoutSec destroys the sandbox this long after it is created
	// (0: the server's default).
	TimeoutSec int64 `json:"timeout_sec,omitempty"`
	// IdleTimeoutSec pauses (block-mode root) or destroys (otherwise) the
	// sandbox once no exec, file or log call touched it this long (0: never).
	IdleTimeoutSec int64 `json:"idle_timeout_sec,omitempty"`
	// Volumes are the caller's persistent volumes the sandbox mounts; it
	// holds each until it ends (one sandbox at a time).
	Volumes []VolumeMount `json:"volumes,omitempty"`
	// OnExit is what happens when the workload's main process exits:
	// OnExitKeep (also when empty: the sandbox shows state exited and its
	// exit until destroyed) or OnExitDestroy (destroyed with its proof).
	OnExit string `json:"on_exit,omitempty"`
}

// OnExit values of a create.
const (
	OnExitKeep    = "keep"
	OnExitDestroy = "destroy"
)

// ExitStatus is how a sandbox's workload ended, as its node saw it: Kind
// "exit" (Code is its status, 128+n for signal n), "oom" (killed at its
// memory limit) or "crash" (its runtime died); Code is -1 but for "exit".
type ExitStatus struct {
	Kind string    `json:"kind"`
	Code int       `json:"code"`
	At   time.Time `json:"at"`
}

// VolumeMount mounts a persistent volume at an absolute guest path.
type VolumeMount struct {
	ID   string `json:"id"`
	Path string `json:"path"`
}

// Volume states.
const (
	VolumeCreating = "creating"
	VolumeReady    = "ready"
	VolumeFailed   = "failed"
	VolumeDeleting = "deleting"
	VolumeDeleted  = "deleted"
)

// VolumeCreateRequest is the body of POST /v1/volumes.
type VolumeCreateRequest struct {
	// Size is the device size ("1Gi"), a multiple of 64Ki; it counts
	// against the owner's disk quota until the volume is deleted.
	Size   string            `json:"size"`
	Labels map[string]string `json:"labels,omitempty"`
}

// Volume is a persistent volume: an ext4 file system in the block store
// that outlives the sandboxes that mount it.
type Volume struct {
	ID        string            `json:"id"`
	State     string            `json:"state"`
	SizeBytes int64             `json:"size_bytes"`
	Labels    map[string]string `json:"labels"`
	CreatedAt time.Time         `json:"created_at"`
	// HeldBy is the active sandbox that mounts it (absent: none).
	HeldBy string `json:"held_by,omitempty"`
	// Reason says why its create failed.
	Reason string `json:"reason,omitempty"`
}

// VolumeList is a page of GET /v1/volumes.
type VolumeList struct {
	Volumes    []Volume `json:"volumes"`
	NextCursor string   `json:"next_cursor,omitempty"`
}

// SandboxResources are the resources a sandbox holds, in base units.
type SandboxResources struct {
	CPUMillis   int64 `json:"cpu_millis"`
	MemoryBytes int64 `json:"memory_bytes"`
	DiskBytes   int64 `json:"disk_bytes"`
	PIDs        int64 `json:"pids"`
}

// Sandbox states as the service reports them.
const (
	StateCreating  = "creating"
	StateReady     = "ready"
	StatePaused    = "paused"
	StateReleasing = "releasing"
	StateDestroyed = "destroyed"
	StateFailed    = "failed"
	// StateExited: the workload exited and the sandbox was kept
	// (on_exit keep); Sandbox.Exit says how. Destroy it to end it.
	StateExited = "exited"
)

// Sandbox is a sandbox of the caller's owner.
type Sandbox struct {
	ID         string            `json:"id"`
	State      string            `json:"state"`
	Generation uint64            `json:"generation"`
	Template   string            `json:"template"`
	Resources  SandboxResources  `json:"resources"`
	Labels     map[string]string `json:"labels"`
	CreatedAt  time.Time         `json:"created_at"`
	// EndsAt is when the timeout destroys it (absent: no timeout armed).
	EndsAt *time.Time `json:"ends_at,omitempty"`
	// Reason says why it ended or failed.
	Reason string `json:"reason,omitempty"`
	// Volumes are the persistent volumes it mounts.
	Volumes []VolumeMount `json:"volumes,omitempty"`
	// Exit is how its workload ended (absent: it did not, or not yet seen).
	Exit *ExitStatus `json:"exit,omitempty"`
}

// SandboxList is a page of GET /v1/sandboxes; NextCursor, when set, is
// the cursor of the next page.
type SandboxList struct {
	Sandboxes  []Sandbox `json:"sandboxes"`
	NextCursor string    `json:"next_cursor,omitempty"`
}

// ProofCheck is one check of a cleanup proof.
type ProofCheck struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail,omitempty"`
}

// Proof is a cleanup proof with the manager's verdict: Verified means
// signed by the node's pinned key and about this operation; Clean that
// every check passed.
type Proof struct {
	OperationID  string       `json:"operation_id"`
	NodeID       string       `json:"node_id"`
	Generation   uint64       `json:"generation"`
	Verified     bool         `json:"verified"`
	Clean        bool         `json:"clean"`
	Reason       string       `json:"reason,omitempty"`
	FailedChecks []string     `json:"failed_checks,omitempty"`
	Checks       []ProofCheck `json:"checks"`
	Signature    []byte       `json:"signature"`
}

// DestroyResult answers DELETE /v1/sandboxes/{id}.
type DestroyResult struct {
	Sandbox Sandbox `json:"sandbox"`
	Proof   Proof   `json:"proof"`
}

// ExecRequest is the body of POST /v1/sandboxes/{id}/exec.
type ExecRequest struct {
	Args       []string          `json:"args"`
	Env        map[string]string `json:"env,omitempty"`
	Cwd        string            `json:"cwd,omitempty"`
	Stdin      []byte            `json:"stdin,omitempty"` // base64 in JSON
	TimeoutSec int64             `json:"timeout_sec,omitempty"`
	User       *User             `json:"user,omitempty"`
}

// ExecResult is the JSON answer of exec; each output is capped and
// flagged when cut.
type ExecResult struct {
	ExitCode        int    `json:"exit_code"`
	Stdout          []byte `json:"stdout"`
	Stderr          []byte `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated,omitempty"`
	StderrTruncated bool   `json:"stderr_truncated,omitempty"`
}

// Exec event stream (Accept: text/event-stream): events "stdout" and
// "stderr" (data: base64 of a chunk), then "exit" (data: ExecExit JSON)
// or "error" (data: ErrorBody JSON).
const (
	EventStdout = "stdout"
	EventStderr = "stderr"
	EventExit   = "exit"
	EventError  = "error"
)

// Event types of GET /v1/events (each event's data is an Event).
const (
	EventCreated   = "created"
	EventReady     = "ready"
	EventFailed    = "failed"
	EventPaused    = "paused"
	EventResumed   = "resumed"
	EventDestroyed = "destroyed"
	EventExited    = "exited" // the workload exited; reason says how
)

// Event is something that happened to one of the caller's sandboxes.
type Event struct {
	// Seq orders the caller's events; it is the cursor to resume after
	// (EventsAfter, or the stream's Last-Event-ID).
	Seq       int64     `json:"seq"`
	Type      string    `json:"type"`
	SandboxID string    `json:"sandbox_id"`
	Reason    string    `json:"reason,omitempty"`
	Time      time.Time `json:"time"`
}

// LogsResult answers GET .../logs without follow.
type LogsResult struct {
	Log       []byte `json:"log"`
	Truncated bool   `json:"truncated,omitempty"`
	Reason    string `json:"reason"`
}

// Log stream events (GET .../logs?follow=true): "log" (data: base64 of a
// chunk), then "end" (data: LogsEnd JSON) or "error".
const (
	EventLog = "log"
	EventEnd = "end"
)

// LogsEnd says why a log follow ended.
type LogsEnd struct {
	Reason string `json:"reason"`
}

// ExecExit is the data of the exit event.
type ExecExit struct {
	ExitCode int `json:"exit_code"`
}

// FileInfo is a file in the guest.
type FileInfo struct {
	Name  string `json:"name"`
	Size  int64  `json:"size"`
	Mode  uint32 `json:"mode"`
	MTime int64  `json:"mtime"`
	UID   uint32 `json:"uid"`
	GID   uint32 `json:"gid"`
	IsDir bool   `json:"is_dir"`
	Link  string `json:"link,omitempty"`
}

// FileList answers GET .../files/list.
type FileList struct {
	Entries []FileInfo `json:"entries"`
}

// MkdirRequest is the body of POST .../files/mkdir.
type MkdirRequest struct {
	Path    string `json:"path"`
	Parents bool   `json:"parents,omitempty"`
}

// RemoveRequest is the body of POST .../files/remove.
type RemoveRequest struct {
	Path      string `json:"path"`
	Recursive bool   `json:"recursive,omitempty"`
}

// MoveRequest is the body of POST .../files/move.
type MoveRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// TimeoutRequest is the body of POST .../timeout: the sandbox is
// destroyed TimeoutSec from now.
type TimeoutRequest struct {
	TimeoutSec int64 `json:"timeout_sec"`
}

// SnapshotRequest names a snapshot of a running block-mode sandbox.
type SnapshotRequest struct {
	Name string `json:"name"`
}

// Snapshot is a named, sealed block generation of a sandbox's files.
type Snapshot struct {
	Name       string `json:"name"`
	Generation uint64 `json:"generation"`
}

// SnapshotList is a sandbox's snapshots.
type SnapshotList struct {
	Snapshots []Snapshot `json:"snapshots"`
}

// RestoreRequest names the snapshot a paused sandbox's files move to.
type RestoreRequest struct {
	Snapshot string `json:"snapshot"`
}

// ForkRequest makes a new sandbox of the source's spec whose files are
// the source's Snapshot, or without one its last published head.
type ForkRequest struct {
	Snapshot   string            `json:"snapshot,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
	TimeoutSec int64             `json:"timeout_sec,omitempty"`
}

// Template is a RootFS template a sandbox can be created from.
type Template struct {
	Name string `json:"name"`
	Mode string `json:"mode"` // overlay or block
	// Languages are what the code call runs in its sandboxes.
	Languages []string `json:"languages,omitempty"`
}

// TemplateList answers GET /v1/templates.
type TemplateList struct {
	Templates []Template `json:"templates"`
}
