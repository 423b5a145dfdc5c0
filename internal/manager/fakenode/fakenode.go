// Package fakenode is an in-memory ctld for ctl-manager's tests: an
// apiserver.Service served by the real apiserver.Server on a real Unix socket. Claims
// and releases are idempotent by operation id like ctld's, and cleanup
// proofs are signed with an ed25519 key.
package fakenode

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/apiserver"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/guestlog"
	"github.com/ctld/ctld/internal/names"
	"github.com/ctld/ctld/internal/proof"
)

// Node is the fake. Set the exported knobs before serving or under Lock.
type Node struct {
	mu sync.Mutex

	// heads are the sandbox volumes' heads Pause published; pauses the
	// head each pause operation published (a retry answers the same).
	heads  map[string]api.VolumeHead
	pauses map[string]api.VolumeHead
	// snaps are the sandbox volumes' snapshots (BlockStore only).
	snaps map[string][]api.Snapshot
	// usage is the metering stream (usage.go).
	usage      []api.UsageRecord
	usageAcked uint64

	// BlockStore, when set, makes snapshot, fork and restore work on the
	// heads in memory (no files move); unset, they are refused as on a
	// node without a block store.
	BlockStore bool

	NodeID string
	// Key is the node's identity key; Signer signs proofs and is Key
	// unless a test swaps it to forge proofs.
	Key    ed25519.PrivateKey
	Signer ed25519.PrivateKey
	// Rotation, when set, is presented with the key (GET /v1/node).
	Rotation *api.KeyRotation
	// FailRelease is FailClaim for releases.
	FailRelease func(req api.ReleaseRequest) error
	// Tamper, when set, edits each proof after it is signed.
	Tamper func(p *api.CleanupProof)
	// FailClaim, when set, is asked before each claim; a non-nil error is
	// the answer (and is not remembered, like a dropped request).
	FailClaim func(req api.ClaimRequest) error
	// Hold, when set, is called without the node's lock before a claim or
	// release (kind "claim" or "release") is carried out (after false)
	// and after it is recorded, before its answer (after true); a non-nil
	// error is the answer instead. Tests hold a call there while they kill
	// the manager that sent it.
	Hold func(kind, id string, after bool) error
	// LoseClaimAnswer, when set, is asked after each new claim is done; a
	// non-nil error is the answer instead (the claim happened, its answer
	// was lost on the way).
	LoseClaimAnswer func(req api.ClaimRequest) error
	// Unclean names proof checks that fail.
	Unclean []string
	// GuestLog is each sandbox's init output, by sandbox id; a follow
	// streams what is appended to it until the sandbox stops being ready
	// or req.IdleSec passes without output.
	GuestLog map[string]string
	// Withheld is what GET /v1/node lists as withheld.
	Withheld []api.WithheldLease
	// Warm is GET /v1/node's warm row (a warm pool's members).
	Warm api.Capacity

	sandboxes map[string]api.Sandbox
	claims    map[string]api.ClaimResponse
	requests  map[string]any // operation id → the request it answered (as the node's request hash)
	releases  map[string]api.ReleaseResponse
	files     map[string][]byte
	policies  map[string]api.NetworkPolicy
	// ClaimOps records the operation id of every claim that reached Claim.
	ClaimOps   []string
	ReleaseOps []string
	// Sessions records every session's request, Signals every signal a
	// session got, RunscExecs the execs asked to go through runsc.
	Sessions   []api.ExecRequest
	Signals    []int
	RunscExecs int

	dirs  map[string]uint32 // fsKey → permission bits
	modes map[string]uint32 // fsKey of a file → its mode
}

// guestDirs are the directories a fresh guest has.
var guestDirs = []string{"/bin", "/etc", "/home", "/root", "/tmp"}

// New returns a fake node with a fresh key.
func New(nodeID string) *Node {
	_, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		panic(err)
	}
	return &Node{
		NodeID: nodeID, Key: priv, Signer: priv,
		sandboxes: map[string]api.Sandbox{},
		claims:    map[string]api.ClaimResponse{},
		requests:  map[string]any{},
		releases:  map[string]api.ReleaseResponse{},
		files:     map[string][]byte{},
		policies:  map[string]api.NetworkPolicy{},
		GuestLog:  map[string]string{},
		dirs:      map[string]uint32{},
		modes:     map[string]uint32{},
	}
}

// Lock and Unlock guard the knobs while the fake is serving.
func (n *Node) Lock()   { n.mu.Lock() }
func (n *Node) Unlock() { n.mu.Unlock() }

// Serve serves n on a fresh Unix socket until the test ends and returns the
// socket path.
func Serve(t testing.TB, n *Node) string {
	t.Helper()
	// A short directory: t.TempDir() can exceed the 108-byte sun_path.
	dir, err := os.MkdirTemp("", "fakenode")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "ctld.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	srv := &apiserver.Server{Service: n, AllowedGID: os.Getgid(), ShutdownGrace: time.Second, Usage: usageServer{n}}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("fake node: %v", err)
		}
		os.RemoveAll(dir)
	})
	return path
}

// Node implements apiserver.Service.
func (n *Node) Node(context.Context) (api.Node, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	var leased api.Capacity
	for _, sb := range n.sandboxes {
		if sb.State == api.StateReady {
			leased.CPUMillis += sb.Resources.CPUMillis
			leased.MemoryBytes += sb.Resources.MemoryBytes
			leased.PIDs += sb.Resources.PIDs
		}
	}
	total := api.Capacity{CPUMillis: 2000, MemoryBytes: 4 << 30, PIDs: 4096, NBDDevices: 16, Addresses: 250, DiskBytes: 10 << 30}
	return api.Node{
		NodeID: n.NodeID, BootID: "boot-1", Slot: "a", Role: "primary", Epoch: 3, NodeKey: n.Key.Public().(ed25519.PublicKey), KeyRotation: n.Rotation,
		Versions: api.Versions{Ctld: "test", Kernel: "6.1.0", Runsc: "20221219", Nft: "1.0.6"},
		Capacity: api.NodeCapacity{Total: total, Allocatable: total, Leased: leased, Warm: n.Warm},
		Withheld: n.Withheld,
	}, nil
}

// held runs call between the Hold hook's two calls.
func held[T any](n *Node, kind, id string, call func() (T, error)) (T, error) {
	var zero T
	n.mu.Lock()
	hold := n.Hold
	n.mu.Unlock()
	if hold != nil {
		if err := hold(kind, id, false); err != nil {
			return zero, err
		}
	}
	out, err := call()
	if err == nil && hold != nil {
		if err := hold(kind, id, true); err != nil {
			return zero, err
		}
	}
	return out, err
}

// Claim implements apiserver.Service.
func (n *Node) Claim(_ context.Context, id string, req api.ClaimRequest) (api.ClaimResponse, error) {
	return held(n, "claim", id, func() (api.ClaimResponse, error) { return n.claim(id, req) })
}

func (n *Node) claim(id string, req api.ClaimRequest) (api.ClaimResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.ClaimOps = append(n.ClaimOps, req.OperationID)
	if n.FailClaim != nil {
		if err := n.FailClaim(req); err != nil {
			return api.ClaimResponse{}, err
		}
	}
	if r, ok := n.claims[req.OperationID]; ok {
		if err := n.sameRequest(req.OperationID, id, req); err != nil {
			return api.ClaimResponse{}, err
		}
		return r, nil
	}
	if cur, ok := n.sandboxes[id]; ok && cur.State == api.StateReady {
		return api.ClaimResponse{}, errdefs.Errorf(errdefs.CodeConflict, "sandbox %s generation %d is ready", id, cur.Generation)
	} else if ok && req.Generation <= cur.Generation {
		return api.ClaimResponse{}, errdefs.Errorf(errdefs.CodeConflict, "generation %d is not newer than the sandbox's generation %d", req.Generation, cur.Generation)
	}
	sb := api.Sandbox{
		ID: id, Generation: req.Generation, State: api.StateReady,
		ContainerID: names.Generation(id, req.Generation), LeaseID: names.Generation(id, req.Generation),
		Resources: req.Resources, RootFS: req.RootFS, Epoch: 3, CreatedAt: time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC),
		Timings: api.Timings{LeaseMS: 1, RootFSMS: 2, NetworkMS: 3, RunscMS: 4, ProofMS: 5, TotalMS: 15},
		Network: &api.NetworkStatus{Mode: req.Network.EffectiveMode()},
		Volumes: req.Volumes,
	}
	if req.RootFS.Mode == api.RootFSBlock {
		sb.Writer = &api.BlockWriter{Epoch: req.Generation, PID: 4242, Device: "/dev/nbd0"}
	}
	n.sandboxes[id] = sb
	n.policies[id] = req.Network
	for _, d := range guestDirs {
		n.dirs[fsKey(id, d)] = 0o755
	}
	r := api.ClaimResponse{Sandbox: sb}
	n.claims[req.OperationID] = r
	n.requests[req.OperationID] = []any{id, req}
	if n.LoseClaimAnswer != nil {
		if err := n.LoseClaimAnswer(req); err != nil {
			return api.ClaimResponse{}, err
		}
	}
	return r, nil
}

// Exec implements apiserver.Service: a session's commands (see
// agentcalls.go) with req.Stdin as stdin, no terminal.
func (n *Node) Exec(_ context.Context, id string, req api.ExecRequest, stdout, stderr io.Writer) (int, error) {
	if err := n.ready(id); err != nil {
		return 0, err
	}
	if code, ok, err := n.execScript(id, req, orDiscard(stdout), orDiscard(stderr)); ok {
		return code, err
	}
	x := run(req, &termState{}, bytes.NewReader(req.Stdin), orDiscard(stdout), orDiscard(stderr))
	return x.ExitCode, nil
}

func joinArgs(a []string) string {
	var b bytes.Buffer
	for i, s := range a {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(s)
	}
	return b.String()
}

func (n *Node) ready(id string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	sb, ok := n.sandboxes[id]
	if !ok {
		return errdefs.Errorf(errdefs.CodeNotFound, "sandbox %q not found", id)
	}
	if sb.State != api.StateReady {
		return errdefs.Errorf(errdefs.CodeConflict, "sandbox %q generation %d is %s, not ready", id, sb.Generation, sb.State)
	}
	return nil
}

// sameRequest refuses, as the node does, an operation id used before for
// another request. Call with n.mu held.
func (n *Node) sameRequest(op, id string, req any) error {
	if !reflect.DeepEqual(n.requests[op], []any{id, req}) {
		return errdefs.Errorf(errdefs.CodeConflict, "operation_id %q was used for a different request", op)
	}
	return nil
}

// ReadFile implements apiserver.Service.
func (n *Node) ReadFile(_ context.Context, id, path string, _ int64) ([]byte, error) {
	if err := n.ready(id); err != nil {
		return nil, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	b, ok := n.files[fsKey(id, path)]
	if !ok {
		return nil, errdefs.Errorf(errdefs.CodeNotFound, "no file %s in sandbox %s", path, id)
	}
	return b, nil
}

// WriteFile implements apiserver.Service.
func (n *Node) WriteFile(_ context.Context, id, path string, data []byte) error {
	if err := n.ready(id); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.files[fsKey(id, path)] = bytes.Clone(data)
	return nil
}

// Release implements apiserver.Service.
func (n *Node) Release(_ context.Context, id string, req api.ReleaseRequest) (api.ReleaseResponse, error) {
	return held(n, "release", id, func() (api.ReleaseResponse, error) { return n.release(id, req) })
}

func (n *Node) release(id string, req api.ReleaseRequest) (api.ReleaseResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.ReleaseOps = append(n.ReleaseOps, req.OperationID)
	if n.FailRelease != nil {
		if err := n.FailRelease(req); err != nil {
			return api.ReleaseResponse{}, err
		}
	}
	if r, ok := n.releases[req.OperationID]; ok {
		if err := n.sameRequest(req.OperationID, id, req); err != nil {
			return api.ReleaseResponse{}, err
		}
		return r, nil
	}
	sb, ok := n.sandboxes[id]
	switch {
	case !ok:
		return api.ReleaseResponse{}, errdefs.Errorf(errdefs.CodeNotFound, "sandbox %q not found", id)
	case req.Generation != 0 && sb.Generation != req.Generation: // 0: the current one
		return api.ReleaseResponse{}, errdefs.Errorf(errdefs.CodeFenced, "release of generation %d refused: current generation is %d", req.Generation, sb.Generation)
	case sb.State != api.StateReady && sb.State != api.StateExited:
		return api.ReleaseResponse{}, errdefs.Errorf(errdefs.CodeConflict, "sandbox %q generation %d is already %s", id, sb.Generation, sb.State)
	}
	sb.State, sb.ProofOperationID = api.StateReleased, req.OperationID
	n.sandboxes[id] = sb
	p := api.CleanupProof{
		OperationID: req.OperationID, NodeID: n.NodeID, BootID: "boot-1", Epoch: 3,
		SandboxID: id, Generation: sb.Generation, LeaseID: sb.LeaseID, Clean: true,
		Time: time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC),
	}
	for _, c := range []string{"cgroup_removed", "container_absent", "mounts_absent", "netns_removed"} {
		ok := true
		for _, u := range n.Unclean {
			if u == c {
				ok, p.Clean = false, false
			}
		}
		p.Checks = append(p.Checks, api.ProofCheck{Name: c, OK: ok})
	}
	rec := p.Record()
	if err := proof.Sign(proof.Identity{NodeID: n.NodeID, BootID: p.BootID, Key: n.Signer}, &rec); err != nil {
		return api.ReleaseResponse{}, err
	}
	p = api.CleanupProofOf(rec)
	if n.Tamper != nil {
		n.Tamper(&p)
	}
	r := api.ReleaseResponse{Sandbox: sb, Proof: p}
	n.releases[req.OperationID] = r
	n.requests[req.OperationID] = []any{id, req}
	return r, nil
}

// UpdateNetwork implements apiserver.Service: the ready generation takes
// the policy at once; its counters carry on.
func (n *Node) UpdateNetwork(_ context.Context, id string, p api.NetworkPolicy) (api.Sandbox, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	sb, ok := n.sandboxes[id]
	if !ok {
		return sb, errdefs.Errorf(errdefs.CodeNotFound, "sandbox %q not found", id)
	}
	if sb.State != api.StateReady {
		return api.Sandbox{}, errdefs.Errorf(errdefs.CodeConflict, "sandbox %q generation %d is %s, not ready", id, sb.Generation, sb.State)
	}
	var st api.NetworkStatus
	if sb.Network != nil {
		st = *sb.Network
	}
	st.Mode = p.EffectiveMode()
	sb.Network = &st
	n.sandboxes[id] = sb
	n.policies[id] = p
	return sb, nil
}

// Policy is the network policy sandbox id's generation holds (from its
// claim or its latest update).
func (n *Node) Policy(id string) (api.NetworkPolicy, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	p, ok := n.policies[id]
	return p, ok
}

// List implements apiserver.Service.
func (n *Node) List(context.Context) (api.SandboxList, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	var l api.SandboxList
	for _, sb := range n.sandboxes {
		l.Sandboxes = append(l.Sandboxes, sb)
	}
	return l, nil
}

// Put places a sandbox on the node as if another manager created it.
func (n *Node) Put(sb api.Sandbox) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.sandboxes[sb.ID] = sb
}

// Get implements apiserver.Service.
func (n *Node) Get(_ context.Context, id string) (api.Sandbox, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	sb, ok := n.sandboxes[id]
	if !ok {
		return sb, errdefs.Errorf(errdefs.CodeNotFound, "sandbox %s not found", id)
	}
	return sb, nil
}

// Proof implements apiserver.Service.
func (n *Node) Proof(_ context.Context, opID string) (api.CleanupProof, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	r, ok := n.releases[opID]
	if !ok {
		return api.CleanupProof{}, errdefs.Errorf(errdefs.CodeNotFound, "no proof for operation %s", opID)
	}
	return r.Proof, nil
}

// Logs implements apiserver.Service.
func (n *Node) Logs(ctx context.Context, id string, req api.LogsRequest, w io.Writer) (api.LogsEnd, error) {
	sb, err := n.Get(ctx, id)
	if err != nil {
		return api.LogsEnd{}, err
	}
	if sb.State != api.StateReady {
		return api.LogsEnd{}, errdefs.Errorf(errdefs.CodeNotFound, "sandbox %s generation %d is %s: its log files were removed with it", id, sb.Generation, sb.State)
	}
	logOf := func() string {
		n.mu.Lock()
		defer n.mu.Unlock()
		return n.GuestLog[id]
	}
	sent := logOf()
	w.Write(guestlog.LastLines([]byte(sent), req.Tail))
	end := api.LogsEnd{Generation: sb.Generation, Reason: "end of log"}
	if !req.Follow {
		return end, nil
	}
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return end, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
		if cur := logOf(); len(cur) > len(sent) {
			w.Write([]byte(cur[len(sent):]))
			sent, last = cur, time.Now()
		}
		if cur, err := n.Get(ctx, id); err != nil || cur.State != api.StateReady {
			end.Reason = fmt.Sprintf("generation %d ended (%s)", sb.Generation, cur.State)
			return end, nil
		}
		if time.Since(last) >= time.Duration(req.IdleSec)*time.Second {
			end.Reason = fmt.Sprintf("no output for %ds", req.IdleSec)
			return end, nil
		}
	}
}
