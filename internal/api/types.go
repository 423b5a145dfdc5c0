// Package api is the wire contract of ctld's local API: HTTP/1.1 + JSON over
// a Unix socket, versioned under /v1. It holds the request and response
// types, their validation, the wire form of errors (ErrorBody; the kinds are
// package errdefs) and the client. The server is package apiserver. It holds
// no node logic.
package api

import (
	"io"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
)

// ErrorBody is the JSON body of every error response.
type ErrorBody struct {
	Code    errdefs.Code `json:"code"`
	Message string       `json:"message"`
	// RetryAfterSec, when set, is how long the caller should wait before
	// trying again (also sent as the Retry-After header): the node is busy
	// (a concurrency limit), not broken.
	RetryAfterSec int64 `json:"retry_after_sec,omitempty"`
}

// Capacity is an amount of each resource ctld hands out.
type Capacity struct {
	CPUMillis   int64 `json:"cpu_millis"`
	MemoryBytes int64 `json:"memory_bytes"`
	PIDs        int64 `json:"pids"`
	NBDDevices  int64 `json:"nbd_devices"`
	Addresses   int64 `json:"addresses"`
	DiskBytes   int64 `json:"disk_bytes"`
}

// NodeCapacity is the node's capacity ledger. Allocatable = total - reserve;
// free = allocatable - leased - warm - withheld. Warm is what the warm
// pool's members hold (never also in leased).
type NodeCapacity struct {
	Total       Capacity `json:"total"`
	Allocatable Capacity `json:"allocatable"`
	Leased      Capacity `json:"leased"`
	Warm        Capacity `json:"warm"`
	Withheld    Capacity `json:"withheld"`
}

// Versions of the kernel pieces ctld depends on.
type Versions struct {
	Ctld   string `json:"ctld"`
	Kernel string `json:"kernel"`
	Runsc  string `json:"runsc"`
	Nft    string `json:"nft"`
}

// Role is what the answering instance is: only a primary serves the API,
// so GET /v1/node says RolePrimary.
type Role string

// RolePrimary is the role of the instance that serves the API.
const RolePrimary Role = "primary"

// KeyRotation is a signed move of a node's proof key (proof.Rotation).
type KeyRotation struct {
	NodeID       string    `json:"node_id"`
	OldKey       []byte    `json:"old_key"`
	NewKey       []byte    `json:"new_key"`
	IssuedAt     time.Time `json:"issued_at"`
	OldSignature []byte    `json:"old_signature"`
	NewSignature []byte    `json:"new_signature"`
	Version      int       `json:"version"`
}

// Node is the answer to GET /v1/node.
type Node struct {
	NodeID string `json:"node_id"`
	BootID string `json:"boot_id"`
	Slot   string `json:"slot"`
	Role   Role   `json:"role"`
	Epoch  uint64 `json:"epoch"`
	// NodeKey is the ed25519 public key that signs this node's cleanup
	// proofs; a manager pins it on first contact.
	NodeKey []byte `json:"node_key"`
	// KeyRotation, while the node rotates its key, moves a manager's
	// pinned key to NodeKey: signed by the previous key and by NodeKey.
	KeyRotation *KeyRotation `json:"key_rotation,omitempty"`
	Versions    Versions     `json:"versions"`
	Capacity    NodeCapacity `json:"capacity"`
	// Withheld lists the generations whose cleanup could not be proven.
	Withheld []WithheldLease `json:"withheld_leases,omitempty"`
	// WarmPools are the node's warm pools, by template (none: no pool).
	WarmPools []WarmPool `json:"warm_pools,omitempty"`
}

// WarmPool is one warm pool's state: its members now (idle: ready to be
// taken; booting) and its claims since the primary's term began (hits:
// claims a member made ready; misses: claims of the pool made cold, no
// idle member or a member that failed its claim). Its members' capacity
// is NodeCapacity.Warm.
type WarmPool struct {
	Template string `json:"template"`
	Idle     int    `json:"idle"`
	Booting  int    `json:"booting"`
	Hits     uint64 `json:"hits"`
	Misses   uint64 `json:"misses"`
}

// WithheldLease is capacity held back because its cleanup is unproven.
// The node retries the teardown on takeover and on a timer with backoff;
// a clean proof (stored under ProofOperationID) returns the capacity.
type WithheldLease struct {
	SandboxID  string   `json:"sandbox_id"`
	Generation uint64   `json:"generation"`
	Reason     string   `json:"reason"`
	Resources  Capacity `json:"resources"`
	// FailedChecks are the failed checks of the latest cleanup proof.
	FailedChecks     []ProofCheck `json:"failed_checks"`
	ProofOperationID string       `json:"proof_operation_id,omitempty"`
	RetryAttempts    int          `json:"retry_attempts"`
	LastAttempt      time.Time    `json:"last_attempt,omitzero"`
	NextAttempt      time.Time    `json:"next_attempt,omitzero"`
}

// Resources asked for by a claim.
type Resources struct {
	CPUMillis   int64  `json:"cpu_millis"`
	MemoryBytes int64  `json:"memory_bytes"`
	PIDs        int64  `json:"pids"`
	Cpuset      string `json:"cpuset,omitempty"`
	// DiskBytes bounds what the guest can write to its RootFS (the overlay
	// upper, enforced by a project quota); 0 asks for the node's default.
	// In block mode it is the template's device size (0: that size).
	DiskBytes int64 `json:"disk_bytes,omitempty"`
}

// RootFSMode is where a RootFS's blocks live: RootFSOverlay (a throw-away
// overlay on scratch) or RootFSBlock (an NBD device over a template in the
// node's block store, served by a writer that outlives the primary).
type RootFSMode string

// RootFS says where a generation's root filesystem comes from.
type RootFS struct {
	Mode     RootFSMode `json:"mode"`
	Template string     `json:"template"` // template name
	// ExpectHead (block mode) is the lowest head of the sandbox's volume
	// the claim may start from, as the manager last recorded it: a head
	// below it (a lower Seq, or the same Seq over another generation) is
	// a rolled-back bucket and the claim is refused (conflict). Zero: the
	// node's own high-water mark alone bounds it.
	ExpectHead VolumeHead `json:"expect_head,omitzero"`
	// WriterEpoch (block mode, in a fleet) is the writer epoch the
	// database gave this generation (its generation number): the node
	// raises the head's writer epoch in the shared block store to it
	// before the writer starts and publishes under it, so the head's
	// compare-and-swap refuses a generation the database took away, on
	// whatever node it runs. Zero: the node's own writer epochs (one
	// node, no takeover).
	WriterEpoch uint64 `json:"writer_epoch,omitempty"`
}

// NetworkPolicy of a sandbox: its egress, enforced on the node's side of
// its veth (an empty mode is deny_all). The whole policy is validated
// (netpolicy.Parse), so a bad rule gets its precise error.
type NetworkPolicy struct {
	Mode  NetworkMode   `json:"mode"`
	Rules []NetworkRule `json:"rules,omitempty"`
}

// NetworkRule allows one destination: a CIDR ("203.0.113.0/24",
// "2001:db8::/32" or a bare address) or a domain ("example.com", or
// "*.example.com" for every name below it; mode restricted only). Protocol
// is "tcp", "udp" or empty for both; Ports are "443" or "8000-8100", empty
// for all.
type NetworkRule struct {
	CIDR     string   `json:"cidr,omitempty"`
	Domain   string   `json:"domain,omitempty"`
	Protocol string   `json:"protocol,omitempty"`
	Ports    []string `json:"ports,omitempty"`
}

// NetworkMode is a sandbox's network mode: NetworkDenyAll, NetworkOpen or
// NetworkRestrict.
type NetworkMode string

// Process is the sandbox's main process.
type Process struct {
	Args []string `json:"args,omitempty"`
	Env  []string `json:"env,omitempty"`
	Cwd  string   `json:"cwd,omitempty"`
	UID  uint32   `json:"uid,omitempty"`
	GID  uint32   `json:"gid,omitempty"`
	// UserSet says UID and GID are the claim's choice, root included:
	// the template image's user does not apply. ctld fills what a claim
	// leaves unset (args, env by variable, cwd, user) from its template
	// image's config.
	UserSet bool `json:"user_set,omitempty"`
}

// ClaimRequest is the body of POST /v1/sandboxes/{id}/claim.
type ClaimRequest struct {
	OperationID    string        `json:"operation_id"`
	Generation     uint64        `json:"generation"`
	RootFS         RootFS        `json:"rootfs"`
	Resources      Resources     `json:"resources"`
	Network        NetworkPolicy `json:"network"`
	Process        Process       `json:"process"`
	MaxLifetimeSec int64         `json:"max_lifetime_sec,omitempty"`
	// Volumes are persistent volumes to attach (block store volumes of
	// their own, kept after the sandbox), each mounted at its Path.
	Volumes []VolumeMount `json:"volumes,omitempty"`
	// OnExit is what the node does when the guest's main process ends:
	// OnExitKeep (also when empty: journal the exit, the generation waits
	// for a release) or OnExitRelease (release it with a cleanup proof).
	OnExit string `json:"on_exit,omitempty"`
}

// OnExit values of a claim.
const (
	OnExitKeep    = "keep"
	OnExitRelease = "release"
)

// VolumeMount attaches persistent volume ID at Path in the guest: an
// absolute, clean path, not "/" nor under a path the node mounts itself.
type VolumeMount struct {
	ID   string `json:"id"`
	Path string `json:"path"`
	// ExpectHead is the lowest head the attach may start from (as
	// RootFS.ExpectHead).
	ExpectHead VolumeHead `json:"expect_head,omitzero"`
	// Head (in a Sandbox, never in a claim) is the head the attach
	// published at its detach, else the head it started from.
	Head *VolumeHead `json:"head,omitempty"`
}

// MaxVolumes bounds a claim's volumes.
const MaxVolumes = 8

// Timings of a claim's steps, in milliseconds.
type Timings struct {
	// AdmitMS is the journal transaction that admits the claim (idempotency
	// lookup, ledger, pending record).
	AdmitMS   float64 `json:"admit_ms"`
	LeaseMS   float64 `json:"lease_ms"`
	RootFSMS  float64 `json:"rootfs_ms"`
	NetworkMS float64 `json:"network_ms"`
	RunscMS   float64 `json:"runsc_ms"`
	ProofMS   float64 `json:"proof_ms"`
	TotalMS   float64 `json:"total_ms"`
	// Steps is each resource's make time, in claim order.
	Steps []StepTiming `json:"steps,omitempty"`
}

// StepTiming is one resource's share of a claim or a release: its make,
// its removal, and its cleanup-proof check, in milliseconds.
type StepTiming struct {
	Resource string  `json:"resource"`
	MakeMS   float64 `json:"make_ms,omitempty"`
	RemoveMS float64 `json:"remove_ms,omitempty"`
	CheckMS  float64 `json:"check_ms,omitempty"`
}

// ReleaseTimings of the teardown that ended a generation (release,
// rollback, lost or withheld retry), in milliseconds: per resource its
// removal and its proof check (in teardown order), the signing and
// journaling of the proof, and the whole.
type ReleaseTimings struct {
	Steps   []StepTiming `json:"steps"`
	ProofMS float64      `json:"proof_ms"`
	TotalMS float64      `json:"total_ms"`
}

// SandboxState is the state of a sandbox's current generation.
type SandboxState string

// Sandbox states.
const (
	StateClaiming  SandboxState = "claiming"
	StateReady     SandboxState = "ready"
	StateReleasing SandboxState = "releasing"
	StateReleased  SandboxState = "released"
	StateFailed    SandboxState = "failed"
	StateLost      SandboxState = "lost"
	// StateExited: the guest ended (Sandbox.Exit says how); it holds its
	// capacity until a release.
	StateExited SandboxState = "exited"
)

// Exit kinds (ExitStatus.Kind).
const (
	ExitNormal = "exit"  // the workload exited; Code is its status
	ExitOOM    = "oom"   // killed at the lease's memory.max
	ExitCrash  = "crash" // the guest died without its agent's report
)

// ExitStatus is how and when a generation's guest ended, as the primary
// journaled it the moment it saw it.
type ExitStatus struct {
	Kind string `json:"kind"`
	// Code is the workload's exit status (128+n: signal n); -1 for oom
	// and crash.
	Code     int       `json:"code"`
	At       time.Time `json:"at"`
	SeenBy   uint64    `json:"seen_by"`
	OOMKills int64     `json:"oom_kills,omitempty"`
	Detail   string    `json:"detail,omitempty"`
}

// Sandbox is a sandbox as ctld sees it: the identity and its current runtime
// generation.
type Sandbox struct {
	ID          string       `json:"id"`
	Generation  uint64       `json:"generation"`
	State       SandboxState `json:"state"`
	ContainerID string       `json:"container_id,omitempty"`
	LeaseID     string       `json:"lease_id,omitempty"`
	Resources   Resources    `json:"resources"`
	RootFS      RootFS       `json:"rootfs"`
	Epoch       uint64       `json:"epoch"`
	CreatedAt   time.Time    `json:"created_at"`
	Timings     Timings      `json:"timings"`
	// ReleaseTimings is set once a teardown of this generation ran.
	ReleaseTimings *ReleaseTimings `json:"release_timings,omitempty"`
	Reason         string          `json:"reason,omitempty"`
	// OOMKills counts memory.max kills seen in the lease (memory.events).
	OOMKills int64 `json:"oom_kills"`
	// Network is the generation's network mode and packet counters, when
	// the node has them (a generation with a sandbox network).
	Network *NetworkStatus `json:"network,omitempty"`
	// Writer is a block-mode generation's NBD writer while it holds its
	// device (absent for overlay mode and once released).
	Writer *BlockWriter `json:"writer,omitempty"`
	// Pause is the generation's last pause (absent: never paused). State
	// "published" is a pause; "abandoned" a pause that did not publish
	// (the head is unchanged, the guest's writes since the last head are
	// the running generation's dirty tail); "sealing" one in flight.
	Pause *PauseStatus `json:"pause,omitempty"`
	// Volumes are the persistent volumes the generation's claim attached
	// (held until its teardown ends).
	Volumes []VolumeMount `json:"volumes,omitempty"`
	// Exit is how the generation's guest ended (state exited, and kept
	// once released).
	Exit *ExitStatus `json:"exit,omitempty"`
	// Usage is what the generation used (usage.go): live while it runs,
	// the totals of its final usage record once over (absent: unknown).
	Usage *Usage `json:"usage,omitempty"`
	// ProofOperationID is the operation whose cleanup proof ctld stored
	// for this generation's teardown, once torn down: a manager whose
	// release ctld refused (conflict) finds here the proof of a release
	// ctld made itself (on_exit release, max lifetime).
	ProofOperationID string `json:"proof_operation_id,omitempty"`
}

// PauseStatus is a generation's last pause.
type PauseStatus struct {
	State       string     `json:"state"`
	OperationID string     `json:"operation_id"`
	Generation  uint64     `json:"generation,omitempty"` // the block generation sealed
	Head        VolumeHead `json:"head,omitzero"`
	Error       string     `json:"error,omitempty"`
}

// BlockWriter is the writer process of a block-mode generation as the
// node's journal has it.
type BlockWriter struct {
	// Epoch is the writer epoch: every start (the claim's, each restart
	// after the writer died) takes a new, higher one.
	Epoch uint64 `json:"epoch"`
	// PID is the writer process; Device the /dev/nbdX it serves.
	PID    int    `json:"pid,omitempty"`
	Device string `json:"device,omitempty"`
	// Restarts counts the writers started on the device after the one
	// before died.
	Restarts int `json:"restarts,omitempty"`
	// Base is the generation the device writes over: the template's
	// ("templates/NAME@0"), the head's on a resume, the last seal's after
	// a snapshot ("sandboxes/ID@N").
	Base string `json:"base,omitempty"`
}

// NetworkStatus is a generation's network as the node enforces it: its
// mode and the counters of its nft chain (egress it accepted, packets it
// dropped) since the generation's policy was first applied.
type NetworkStatus struct {
	Mode           NetworkMode `json:"mode"`
	TxBytes        uint64      `json:"tx_bytes"`
	TxPackets      uint64      `json:"tx_packets"`
	DroppedPackets uint64      `json:"dropped_packets"`
}

// ClaimResponse answers a claim once the readiness proof arrived.
type ClaimResponse struct {
	Sandbox Sandbox `json:"sandbox"`
}

// ExecRequest is the body of POST /v1/sandboxes/{id}/exec. With
// Accept: text/event-stream the output streams as events "stdout",
// "stderr" (data = base64 chunk) and a last "exit" (data = ExecExit JSON)
// or "error" (data = ErrorBody JSON); see sse.go.
type ExecRequest struct {
	Args       []string `json:"args"`
	Env        []string `json:"env,omitempty"`
	Cwd        string   `json:"cwd,omitempty"`
	Stdin      []byte   `json:"stdin,omitempty"`
	TimeoutSec int64    `json:"timeout_sec,omitempty"`
	// User runs the command as this uid and gid; absent, it runs as the
	// claim's process.uid and process.gid (the workload's user).
	User *User `json:"user,omitempty"`
	// TTY runs the command on a pseudo-terminal of Rows x Cols (a
	// session only: see apiserver.Service.Session).
	TTY  bool   `json:"tty,omitempty"`
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`
}

// TermSize is a terminal's size, for a PTY session's resize.
type TermSize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// Streams are a session's input and output (apiserver.Service.Session).
// Nil readers and writers are empty; Resize and Signal may be nil.
type Streams struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	Resize         <-chan TermSize
	Signal         <-chan int
}

// FileInfo is a guest file as the guest sees it (its agent's stat).
type FileInfo struct {
	Name    string `json:"name"`
	Size    int64  `json:"size"`
	Mode    uint32 `json:"mode"` // Go fs.FileMode bits
	ModUnix int64  `json:"mtime"`
	UID     uint32 `json:"uid"`
	GID     uint32 `json:"gid"`
	Link    string `json:"link,omitempty"` // a symlink's target
}

// User is a numeric uid and gid inside the guest.
type User struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

// ExecResult is the plain JSON answer of exec. Each output is capped at the
// server's MaxFileBytes; the rest is dropped and flagged as truncated.
type ExecResult struct {
	ExitCode        int    `json:"exit_code"`
	Stdout          []byte `json:"stdout"`
	Stderr          []byte `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated,omitempty"`
	StderrTruncated bool   `json:"stderr_truncated,omitempty"`
}

// ReleaseRequest is the body of POST /v1/sandboxes/{id}/release.
type ReleaseRequest struct {
	OperationID string `json:"operation_id"`
	Generation  uint64 `json:"generation"`
}

// ProofCheck is one check of a cleanup proof.
type ProofCheck struct {
	Name   string `json:"name"` // e.g. "cgroup_removed"
	OK     bool   `json:"ok"`
	Detail string `json:"detail,omitempty"`
}

// CleanupProof says everything of one generation is physically gone. It is
// the wire form of a proof.Proof (CleanupProofOf, Record): Signature is
// ed25519 over proof.SignedBytes of the record, a payload of its own
// (versioned by Version) that this JSON does not define, by the node key
// whose public half is NodeKey. Verify with proof.Verify(p.Record(), key).
type CleanupProof struct {
	// Version is the version of the signed payload (absent: a proof made
	// before versions).
	Version     int          `json:"version,omitempty"`
	OperationID string       `json:"operation_id"`
	NodeID      string       `json:"node_id"`
	BootID      string       `json:"boot_id"`
	Epoch       uint64       `json:"epoch"`
	SandboxID   string       `json:"sandbox_id"`
	Generation  uint64       `json:"generation"`
	LeaseID     string       `json:"lease_id"`
	Checks      []ProofCheck `json:"checks"`
	Clean       bool         `json:"clean"`
	Time        time.Time    `json:"time"`
	NodeKey     []byte       `json:"node_key"`
	Signature   []byte       `json:"signature"`
}

// ReleaseResponse answers a release.
type ReleaseResponse struct {
	Sandbox Sandbox      `json:"sandbox"`
	Proof   CleanupProof `json:"proof"`
}

// SandboxList answers GET /v1/sandboxes.
type SandboxList struct {
	Sandboxes []Sandbox `json:"sandboxes"`
}
