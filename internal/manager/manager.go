// Package manager is ctl-manager's core: the SQLite store that keeps the
// lifecycle truth (sandboxes, generations, operations, proofs, nodes) and
// the Manager that drives ctld through its local API, recording every
// mutating operation before it is sent so a retry reuses its operation id.
package manager

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/logging"
	"github.com/ctld/ctld/internal/names"
	"github.com/ctld/ctld/internal/proof"
)

// DefaultSocket is recorded for a node reached through the client's default
// socket path.
const DefaultSocket = "/run/ctld/ctld.sock"

// Manager wires the store and a ctld client.
type Manager struct {
	Store  *Store
	Client *api.Client
	Log    *slog.Logger
	// NewOperationID returns a fresh operation id; nil means 128 random bits.
	NewOperationID func() (string, error)
	// BusyRetries is how many times a claim or exec the node refused as
	// busy (unavailable with a retry hint: it never started) is sent again
	// after the hinted wait. 0: report busy at once.
	BusyRetries int
	// Wait sleeps for a retry hint; nil means a timer that ctx cancels.
	Wait func(ctx context.Context, d time.Duration) error
	// KeyOverlap is how long a node's key stays trusted for proofs after
	// a signed rotation replaced it (0: DefaultKeyOverlap).
	KeyOverlap time.Duration
	// Fleet, if set, places sandboxes on the fleet's nodes instead of
	// driving Client (fleet.go).
	Fleet *Fleet
}

// whileBusy calls fn again while the node answers busy, after the node's
// retry hint, at most BusyRetries times. Only busy answers are retried: the
// node refused them before doing anything, so a repeat is safe even for an
// exec; any other answer is returned as it is.
func (m *Manager) whileBusy(ctx context.Context, what string, fn func() error) error {
	for try := 0; ; try++ {
		err := fn()
		hint := errdefs.RetryAfterOf(err)
		if err == nil || hint <= 0 || errdefs.CodeOf(err) != errdefs.CodeUnavailable || try >= m.BusyRetries {
			return err
		}
		m.log().Info("node busy; retrying after its hint", "what", what, "retry_after", hint, "try", try+1, "of", m.BusyRetries)
		wait := m.Wait
		if wait == nil {
			wait = sleepCtx
		}
		if werr := wait(ctx, hint); werr != nil {
			return errors.Join(err, werr)
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (m *Manager) log() *slog.Logger {
	return logging.OrDiscard(m.Log)
}

func (m *Manager) socket() string {
	if m.Client != nil && m.Client.SocketPath != "" {
		return m.Client.SocketPath
	}
	return DefaultSocket
}

func (m *Manager) newOpID() (string, error) {
	if m.NewOperationID != nil {
		return m.NewOperationID()
	}
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generate operation id: %w", err)
	}
	return "op-" + hex.EncodeToString(b[:]), nil
}

// Spec is what a sandbox is created with.
type Spec struct {
	Resources      api.Resources     `json:"resources"`
	RootFS         api.RootFS        `json:"rootfs"`
	Network        api.NetworkPolicy `json:"network"`
	Process        api.Process       `json:"process"`
	MaxLifetimeSec int64             `json:"max_lifetime_sec,omitempty"`
	Volumes        []api.VolumeMount `json:"volumes,omitempty"`
	// User, if set, is the main process's user, root included: it wins
	// over Process's ids and the template image's user (templates.go).
	User *api.User `json:"user,omitempty"`
	// OnExit is the claim's on_exit (api.OnExitKeep, api.OnExitRelease).
	OnExit string `json:"on_exit,omitempty"`
}

func (s Spec) claim(opID string, gen uint64) api.ClaimRequest {
	return api.ClaimRequest{
		OperationID:    opID,
		Generation:     gen,
		RootFS:         s.RootFS,
		Resources:      s.Resources,
		Network:        s.Network,
		Process:        s.Process,
		MaxLifetimeSec: s.MaxLifetimeSec,
		Volumes:        s.Volumes,
		OnExit:         s.OnExit,
	}
}

// CreateResult is the answer of Create.
type CreateResult struct {
	OperationID string      `json:"operation_id"`
	Reused      bool        `json:"reused_operation"`
	Sandbox     api.Sandbox `json:"sandbox"`
}

// definitive reports whether ctld's answer settles an operation: the node
// refused or failed it and answers the same operation id the same way
// again. Anything else (transport errors, unavailable, not_primary, a
// cancelled context) may or may not have reached the node, so the
// operation stays pending and the next try reuses its id.
func definitive(err error) bool {
	var ae *errdefs.Error
	if !errors.As(err, &ae) {
		return false
	}
	switch ae.Code {
	case errdefs.CodeUnavailable, errdefs.CodeNotPrimary:
		return false
	}
	return true
}

// Create claims the next generation of sandbox id on the node.
func (m *Manager) Create(ctx context.Context, id string, spec Spec) (CreateResult, error) {
	return m.CreateWith(ctx, id, spec, nil)
}

// ClaimFailer records a claim the node refused for good (err says why).
type ClaimFailer func(ctx context.Context, op OperationRecord, err error) error

// CreateWith is Create with fail, when set, recording a claim the node
// refused for good in place of Store.FailOperation: the service fails the
// claim and ends its owner's sandbox with its reason in one transaction
// (Store.FailCreate), so no reader sees the one without the other.
func (m *Manager) CreateWith(ctx context.Context, id string, spec Spec, fail ClaimFailer) (CreateResult, error) {
	if err := names.CheckID("sandbox id", id); err != nil {
		return CreateResult{}, err
	}
	opID, err := m.newOpID()
	if err != nil {
		return CreateResult{}, err
	}
	if spec, err = m.applyDefaults(ctx, spec); err != nil {
		return CreateResult{}, err
	}
	// Bad input is refused here, before anything is recorded.
	if err := spec.claim(opID, 1).Validate(); err != nil {
		return CreateResult{}, err
	}
	if spec, err = m.expectHeads(ctx, id, spec); err != nil {
		return CreateResult{}, err
	}
	if m.Fleet != nil {
		return m.createPlaced(ctx, id, opID, spec)
	}
	node, err := m.contact(ctx)
	if err != nil {
		return CreateResult{}, err
	}
	var nodeGen uint64
	switch cur, err := m.Client.Get(ctx, id); {
	case err == nil:
		nodeGen = cur.Generation
	case errdefs.CodeOf(err) != errdefs.CodeNotFound:
		return CreateResult{}, fmt.Errorf("look up sandbox on node: %w", err)
	}
	request, err := json.Marshal(spec)
	if err != nil {
		return CreateResult{}, fmt.Errorf("encode spec: %w", err)
	}
	op, reused, err := m.Store.BeginClaim(ctx, ClaimIntent{
		SandboxID: id, NodeID: node.Node.NodeID, OperationID: opID,
		Resources: spec.Resources, RootFS: spec.RootFS, Network: spec.Network, Request: request, NodeGeneration: nodeGen,
	})
	if err != nil {
		return CreateResult{}, err
	}
	log := m.log().With("sandbox", id, "generation", op.Generation, "operation", op.OperationID)
	if reused {
		// The node answers a repeated operation id only if the request is
		// the same, so the retry sends what the first try recorded.
		if len(op.Request) > 0 {
			var recorded Spec
			if err := json.Unmarshal(op.Request, &recorded); err != nil {
				return CreateResult{}, fmt.Errorf("decode recorded claim %s: %w", op.OperationID, err)
			}
			spec = recorded
		}
		log.Info("retrying pending claim with its recorded operation id and request")
	}
	res := CreateResult{OperationID: op.OperationID, Reused: reused}
	var resp api.ClaimResponse
	err = m.whileBusy(ctx, "claim "+id, func() (err error) {
		resp, err = m.Client.Claim(ctx, id, spec.claim(op.OperationID, op.Generation))
		return err
	})
	if err != nil {
		if definitive(err) {
			if fail == nil {
				fail = func(ctx context.Context, op OperationRecord, err error) error {
					return m.Store.FailOperation(ctx, op.OperationID, err.Error())
				}
			}
			if ferr := fail(context.WithoutCancel(ctx), op, err); ferr != nil {
				return res, errors.Join(err, ferr)
			}
			log.Warn("claim failed", "err", err)
			return res, err
		}
		log.Warn("claim outcome unknown; operation stays pending for a retry", "err", err)
		return res, err
	}
	// Record even if the caller gave up meanwhile: the node did the work.
	if err := m.Store.FinishClaim(context.WithoutCancel(ctx), op.OperationID, resp.Sandbox); err != nil {
		return res, err
	}
	if err := m.raiseVolumeMarks(context.WithoutCancel(ctx), resp.Sandbox); err != nil {
		return res, err
	}
	log.Info("sandbox ready", "container", resp.Sandbox.ContainerID, "total_ms", resp.Sandbox.Timings.TotalMS)
	res.Sandbox = resp.Sandbox
	return res, nil
}

// contact asks the node who it is and records the contact.
func (m *Manager) contact(ctx context.Context) (NodeStatus, error) {
	n, err := m.Client.Node(ctx)
	if err != nil {
		return NodeStatus{}, fmt.Errorf("contact node: %w", err)
	}
	var key []byte
	if len(n.NodeKey) == ed25519.PublicKeySize {
		key = n.NodeKey
	}
	rec, err := m.Store.PinNode(ctx, n.NodeID, m.socket(), key)
	if err != nil {
		return NodeStatus{}, err
	}
	// Fail closed: a node that now presents another key than the pinned one
	// is not the node whose proofs this store trusts, unless the pinned
	// key signed the move (proof.Rotation).
	if key != nil && rec.PublicKey != nil && !bytes.Equal(rec.PublicKey, key) {
		if rec, err = m.rotate(ctx, n, rec); err != nil {
			return NodeStatus{}, err
		}
	}
	return NodeStatus{Node: n, Record: rec}, nil
}

// Verdict is the manager's judgement of a cleanup proof. Verified means the
// proof is signed by the node's pinned key and is about the operation,
// sandbox and generation it claims; Clean means every check passed.
type Verdict struct {
	OperationID  string           `json:"operation_id"`
	SandboxID    string           `json:"sandbox_id"`
	Generation   uint64           `json:"generation"`
	NodeID       string           `json:"node_id"`
	Source       string           `json:"source"` // "store" or "node"
	Verified     bool             `json:"verified"`
	Clean        bool             `json:"clean"`
	Reason       string           `json:"reason,omitempty"`
	FailedChecks []string         `json:"failed_checks,omitempty"`
	Proof        api.CleanupProof `json:"proof"`
}

// OK reports whether the proof shows, verifiably, that the generation is
// gone.
func (v Verdict) OK() bool { return v.Verified && v.Clean }

// String is the one-line verdict the CLI prints.
func (v Verdict) String() string {
	switch {
	case !v.Verified:
		return fmt.Sprintf("proof %s REJECTED: %s", v.OperationID, v.Reason)
	case !v.Clean:
		return fmt.Sprintf("proof %s verified (node %s, epoch %d) but NOT clean: failed checks: %s",
			v.OperationID, v.NodeID, v.Proof.Epoch, strings.Join(v.FailedChecks, ", "))
	}
	return fmt.Sprintf("proof %s verified: %s generation %d is gone (node %s, epoch %d, %d checks)",
		v.OperationID, v.SandboxID, v.Generation, v.NodeID, v.Proof.Epoch, len(v.Proof.Checks))
}

// want is what a proof must be about.
type want struct {
	opID, sandboxID, nodeID string
	generation              uint64
}

// judge verifies p against the pinned key of its node. A node without a
// pinned key gets the proof's key pinned now (trust on first use: /v1/node
// does not carry the key, so the first proof is the first sight of it);
// every later proof must carry a signature by that same key.
func (m *Manager) judge(ctx context.Context, w want, p api.CleanupProof) (Verdict, error) {
	v := Verdict{OperationID: w.opID, SandboxID: w.sandboxID, Generation: w.generation, NodeID: w.nodeID, Proof: p, Clean: p.Clean}
	for _, c := range p.Checks {
		if !c.OK {
			v.FailedChecks = append(v.FailedChecks, c.Name)
			v.Clean = false
		}
	}
	if len(p.Checks) == 0 {
		v.Clean = false
	}
	switch {
	case p.OperationID != w.opID:
		v.Reason = fmt.Sprintf("proof is for operation %q, not %q", p.OperationID, w.opID)
	case w.sandboxID != "" && p.SandboxID != w.sandboxID:
		v.Reason = fmt.Sprintf("proof is for sandbox %q, not %q", p.SandboxID, w.sandboxID)
	case w.generation != 0 && p.Generation != w.generation:
		v.Reason = fmt.Sprintf("proof is for generation %d, not %d", p.Generation, w.generation)
	case w.nodeID != "" && p.NodeID != w.nodeID:
		v.Reason = fmt.Sprintf("proof is from node %q, not %q", p.NodeID, w.nodeID)
	}
	if v.Reason != "" {
		return v, nil
	}
	v.SandboxID, v.Generation, v.NodeID = p.SandboxID, p.Generation, p.NodeID
	if p.NodeID == "" {
		v.Reason = "proof names no node"
		return v, nil
	}
	node, err := m.Store.Node(ctx, p.NodeID)
	if err != nil && errdefs.CodeOf(err) != errdefs.CodeNotFound {
		return v, err
	}
	if len(node.PublicKey) == 0 {
		if len(p.NodeKey) != ed25519.PublicKeySize {
			v.Reason = fmt.Sprintf("node %s has no pinned key and the proof carries no valid one", p.NodeID)
			return v, nil
		}
		socket := node.Socket
		if socket == "" {
			socket = m.socket()
		}
		if node, err = m.Store.PinNode(ctx, p.NodeID, socket, p.NodeKey); err != nil {
			return v, err
		}
		m.log().Info("pinned node key on first use", "node", p.NodeID, "key", hex.EncodeToString(node.PublicKey))
	}
	// The record is the exact payload the node signed, whatever the
	// API's JSON of it looks like. The key before a rotation signs too
	// during its overlap (proofs made before the rotation).
	var verr error
	for _, k := range node.TrustedKeys(m.Store.now()) {
		if verr = proof.Verify(p.Record(), ed25519.PublicKey(k)); verr == nil {
			break
		}
	}
	if verr != nil {
		v.Reason = fmt.Sprintf("not signed by the pinned key of node %s: %v", p.NodeID, verr)
		return v, nil
	}
	v.Verified = true
	return v, nil
}

// DestroyResult is the answer of Destroy.
type DestroyResult struct {
	OperationID     string      `json:"operation_id"`
	Reused          bool        `json:"reused_operation"`
	AlreadyReleased bool        `json:"already_released,omitempty"`
	Sandbox         api.Sandbox `json:"sandbox"`
	Verdict         Verdict     `json:"verdict"`
}

// Destroy releases the sandbox's current generation with a recorded
// operation id and judges the cleanup proof. The proof is stored with its
// verdict either way; a rejected or unclean proof is reported in the
// result, not as an error, because the release itself happened. A sandbox
// on the node that the manager never created is adopted first.
func (m *Manager) Destroy(ctx context.Context, id string) (DestroyResult, error) {
	if err := names.CheckID("sandbox id", id); err != nil {
		return DestroyResult{}, err
	}
	if m.Fleet != nil {
		return m.destroyPlaced(ctx, id)
	}
	sb, err := m.Store.Sandbox(ctx, id)
	if errdefs.CodeOf(err) == errdefs.CodeNotFound {
		sb, err = m.adopt(ctx, id)
	}
	if err != nil {
		return DestroyResult{}, err
	}
	res, op, done, err := m.beginDestroy(ctx, sb, m.Store.BeginRelease)
	if done || err != nil {
		return res, err
	}
	res.Sandbox, res.Verdict, err = m.releaseWith(ctx, "release", sb, op, func() (api.Sandbox, api.CleanupProof, error) {
		resp, err := m.Client.Release(ctx, id, api.ReleaseRequest{OperationID: op.OperationID, Generation: op.Generation})
		return resp.Sandbox, resp.Proof, err
	})
	if err == nil && res.Verdict.OperationID != "" && res.Verdict.OperationID != op.OperationID {
		// The node had released it itself (nodeRelease).
		res.OperationID, res.AlreadyReleased = res.Verdict.OperationID, true
	}
	return res, err
}

// beginDestroy is the part of a destroy both modes share: an already
// released sandbox is answered with the proof of its release (done);
// otherwise begin records the release (a new operation, or the pending
// one reused) and the caller carries it out.
func (m *Manager) beginDestroy(ctx context.Context, sb SandboxRecord, begin func(ctx context.Context, id, opID string) (OperationRecord, bool, error)) (DestroyResult, OperationRecord, bool, error) {
	if sb.State == api.StateReleased {
		res, err := m.released(ctx, sb)
		return res, OperationRecord{}, true, err
	}
	opID, err := m.newOpID()
	if err != nil {
		return DestroyResult{}, OperationRecord{}, false, err
	}
	op, reused, err := begin(ctx, sb.ID, opID)
	if err != nil {
		return DestroyResult{}, op, false, err
	}
	return DestroyResult{OperationID: op.OperationID, Reused: reused}, op, false, nil
}

// releaseWith sends op, a release of sb's generation (call: the node's
// Release or Pause), judges the cleanup proof it answers with and records
// the release with the proof and verdict. A definitive refusal fails op;
// an unknown outcome leaves it pending for a retry.
func (m *Manager) releaseWith(ctx context.Context, what string, sb SandboxRecord, op OperationRecord, call func() (api.Sandbox, api.CleanupProof, error)) (api.Sandbox, Verdict, error) {
	log := m.log().With("sandbox", sb.ID, "generation", op.Generation, "operation", op.OperationID)
	out, p, err := call()
	if errdefs.CodeOf(err) == errdefs.CodeConflict {
		// Perhaps the node released the generation itself.
		nout, v, ok, nerr := m.nodeRelease(ctx, sb, op)
		switch {
		case ok && nerr == nil && what != "release":
			// Recorded, but what was asked (a pause: a head) did not happen.
			return nout, v, errdefs.Errorf(errdefs.CodeConflict, "sandbox %s generation %d was released by the node itself (operation %s) before the %s", sb.ID, op.Generation, v.OperationID, what)
		case ok:
			return nout, v, nerr
		case nerr != nil:
			log.Warn(what+" refused and the node's view unknown; operation stays pending for a retry", "err", err, "lookup_err", nerr)
			return out, Verdict{}, errors.Join(err, nerr)
		}
	}
	if err != nil {
		if definitive(err) {
			if ferr := m.Store.FailOperation(context.WithoutCancel(ctx), op.OperationID, err.Error()); ferr != nil {
				return out, Verdict{}, errors.Join(err, ferr)
			}
			log.Warn(what+" failed", "err", err)
			return out, Verdict{}, err
		}
		log.Warn(what+" outcome unknown; operation stays pending for a retry", "err", err)
		return out, Verdict{}, err
	}
	ctx = context.WithoutCancel(ctx)
	v, err := m.judge(ctx, want{opID: op.OperationID, sandboxID: sb.ID, generation: op.Generation, nodeID: sb.NodeID}, p)
	if err != nil {
		return out, v, err
	}
	v.Source = "node"
	if err := m.Store.FinishRelease(ctx, op.OperationID, out, ProofRecord{Proof: p, Verified: v.Verified, VerifyError: v.Reason}); err != nil {
		return out, v, err
	}
	if err := m.raiseVolumeMarks(ctx, out); err != nil {
		return out, v, err
	}
	log.Info("sandbox "+what+"d", "proof_verified", v.Verified, "proof_clean", v.Clean, "reason", v.Reason)
	return out, v, nil
}

// adopt records a sandbox that only the node knows.
func (m *Manager) adopt(ctx context.Context, id string) (SandboxRecord, error) {
	sb, err := m.Client.Get(ctx, id)
	if err != nil {
		return SandboxRecord{}, fmt.Errorf("look up sandbox on node: %w", err)
	}
	node, err := m.contact(ctx)
	if err != nil {
		return SandboxRecord{}, err
	}
	if err := m.Store.AdoptSandbox(ctx, node.Node.NodeID, sb); err != nil {
		return SandboxRecord{}, err
	}
	m.log().Info("adopted sandbox found on the node", "sandbox", id, "generation", sb.Generation)
	return m.Store.Sandbox(ctx, id)
}

// released answers Destroy of an already released sandbox with the proof
// of its release: teardown of something gone is success.
func (m *Manager) released(ctx context.Context, sb SandboxRecord) (DestroyResult, error) {
	ops, err := m.Store.Operations(ctx, sb.ID)
	if err != nil {
		return DestroyResult{}, err
	}
	for i := len(ops) - 1; i >= 0; i-- {
		op := ops[i]
		if op.Kind != KindRelease || op.State != OpDone || op.Generation != sb.Generation {
			continue
		}
		v, err := m.VerifyProof(ctx, op.OperationID)
		if err != nil {
			return DestroyResult{}, err
		}
		out := DestroyResult{
			OperationID: op.OperationID, AlreadyReleased: true, Verdict: v,
			Sandbox: api.Sandbox{ID: sb.ID, Generation: sb.Generation, State: sb.State, CreatedAt: sb.CreatedAt},
		}
		gens, err := m.Store.Generations(ctx, sb.ID)
		if err != nil {
			return DestroyResult{}, err
		}
		for _, g := range gens {
			if g.Generation == sb.Generation {
				out.Sandbox.ContainerID, out.Sandbox.LeaseID = g.ContainerID, g.LeaseID
				out.Sandbox.Resources, out.Sandbox.RootFS, out.Sandbox.Timings = g.Resources, g.RootFS, g.Timings
			}
		}
		return out, nil
	}
	return DestroyResult{}, errdefs.Errorf(errdefs.CodeInternal, "sandbox %s is released but no release operation is recorded", sb.ID)
}

// VerifyProof judges the cleanup proof of an operation, stored or fetched
// from the node, and records the verdict when the operation is known. The
// verdict is recomputed every time, never read back.
func (m *Manager) VerifyProof(ctx context.Context, opID string) (Verdict, error) {
	if err := api.ValidateOperationID(opID); err != nil {
		return Verdict{}, err
	}
	w := want{opID: opID}
	op, err := m.Store.Operation(ctx, opID)
	known := err == nil
	switch {
	case known:
		if op.Kind != KindRelease {
			return Verdict{}, errdefs.Errorf(errdefs.CodeInvalidArgument, "operation %s is a %s, only releases have cleanup proofs", opID, op.Kind)
		}
		w.sandboxID, w.generation = op.SandboxID, op.Generation
		sb, err := m.Store.Sandbox(ctx, op.SandboxID)
		if err != nil {
			return Verdict{}, err
		}
		w.nodeID = sb.NodeID
	case errdefs.CodeOf(err) != errdefs.CodeNotFound:
		return Verdict{}, err
	}
	source := "store"
	stored, err := m.Store.Proof(ctx, opID)
	p := stored.Proof
	if errdefs.CodeOf(err) == errdefs.CodeNotFound {
		source = "node"
		if p, err = m.Client.Proof(ctx, opID); err != nil {
			return Verdict{}, fmt.Errorf("fetch proof from node: %w", err)
		}
	} else if err != nil {
		return Verdict{}, err
	}
	v, err := m.judge(ctx, w, p)
	if err != nil {
		return v, err
	}
	v.Source = source
	if known {
		if err := m.Store.SaveProof(ctx, ProofRecord{OperationID: opID, SandboxID: op.SandboxID, Generation: op.Generation, Proof: p, Verified: v.Verified, VerifyError: v.Reason}); err != nil {
			return v, err
		}
	}
	return v, nil
}

// Exec runs a command in the sandbox, streaming its output, and returns the
// guest's exit code.
func (m *Manager) Exec(ctx context.Context, id string, req api.ExecRequest, stdout, stderr io.Writer) (int, error) {
	if err := names.CheckID("sandbox id", id); err != nil {
		return 0, err
	}
	if err := req.Validate(); err != nil {
		return 0, err
	}
	c, err := m.client(ctx, id)
	if err != nil {
		return 0, err
	}
	var code int
	err = m.whileBusy(ctx, "exec in "+id, func() (err error) {
		code, err = c.ExecStream(ctx, id, req, stdout, stderr)
		return err
	})
	return code, err
}

// UpdateNetwork replaces the network policy of the sandbox's running
// generation on the node (a live update) and returns the node's view of
// the sandbox after it. Once the node accepted it, the manager's record
// of that generation holds the new policy (GenerationRecord.Network).
func (m *Manager) UpdateNetwork(ctx context.Context, id string, p api.NetworkPolicy) (api.Sandbox, error) {
	if err := names.CheckID("sandbox id", id); err != nil {
		return api.Sandbox{}, err
	}
	if err := p.Validate(); err != nil {
		return api.Sandbox{}, err
	}
	c, err := m.client(ctx, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	sb, err := c.UpdateNetwork(ctx, id, p)
	if err != nil {
		return sb, err
	}
	if err := m.Store.SetNetwork(ctx, id, sb.Generation, p); err != nil {
		if errdefs.CodeOf(err) != errdefs.CodeNotFound {
			return sb, fmt.Errorf("the node applied the network policy of %s, but the manager did not record it: %w", id, err)
		}
		// A sandbox the store does not know (made by another manager):
		// the node's record is all there is.
		m.log().Warn("live update of a generation the manager does not know", "sandbox", id, "generation", sb.Generation)
	}
	return sb, nil
}

// Logs copies the output of the sandbox's main process to w (see
// api.Client.Logs).
func (m *Manager) Logs(ctx context.Context, id string, req api.LogsRequest, w io.Writer) (api.LogsEnd, error) {
	if err := names.CheckID("sandbox id", id); err != nil {
		return api.LogsEnd{}, err
	}
	if err := req.Validate(); err != nil {
		return api.LogsEnd{}, err
	}
	c, err := m.client(ctx, id)
	if err != nil {
		return api.LogsEnd{}, err
	}
	return c.Logs(ctx, id, req, w)
}

// ReadFile reads a file inside the sandbox.
func (m *Manager) ReadFile(ctx context.Context, id, path string) ([]byte, error) {
	if err := errors.Join(names.CheckID("sandbox id", id), api.ValidateFilePath(path)); err != nil {
		return nil, err
	}
	c, err := m.client(ctx, id)
	if err != nil {
		return nil, err
	}
	return c.ReadFile(ctx, id, path)
}

// WriteFile writes a file inside the sandbox.
func (m *Manager) WriteFile(ctx context.Context, id, path string, data []byte) error {
	if err := errors.Join(names.CheckID("sandbox id", id), api.ValidateFilePath(path)); err != nil {
		return err
	}
	c, err := m.client(ctx, id)
	if err != nil {
		return err
	}
	return c.WriteFile(ctx, id, path, data)
}

// Entry is one sandbox of Ls: what the manager recorded next to what the
// node reports.
type Entry struct {
	ID     string         `json:"id"`
	Store  *SandboxRecord `json:"store,omitempty"`
	Node   *api.Sandbox   `json:"node,omitempty"`
	Status string         `json:"status"`
}

// Entry statuses.
const (
	StatusInSync         = "in_sync"
	StatusDrift          = "drift"              // both know it, disagreeing on generation or state
	StatusMissingOnNode  = "missing_on_node"    // recorded live, node does not have it
	StatusUnknownToStore = "unknown_to_manager" // node has it, manager never recorded it
	StatusNodeUnknown    = "node_unreachable"
)

// Listing is the answer of Ls.
type Listing struct {
	Sandboxes []Entry `json:"sandboxes"`
	// NodeError is why the node's view is missing, if it is.
	NodeError string `json:"node_error,omitempty"`
}

// Ls merges the store's sandboxes with the node's list. An unreachable node
// still yields the store's view, marked as such.
func (m *Manager) Ls(ctx context.Context) (Listing, error) {
	recs, err := m.Store.Sandboxes(ctx)
	if err != nil {
		return Listing{}, err
	}
	var out Listing
	nodeList, nerr := m.Client.List(ctx)
	if nerr != nil {
		out.NodeError = nerr.Error()
	}
	return mergeListing(out, recs, nodeList.Sandboxes, nerr == nil), nil
}

func mergeListing(out Listing, recs []SandboxRecord, onNode []api.Sandbox, nodeOK bool) Listing {
	byID := map[string]*Entry{}
	var ids []string
	get := func(id string) *Entry {
		e, ok := byID[id]
		if !ok {
			e = &Entry{ID: id}
			byID[id] = e
			ids = append(ids, id)
		}
		return e
	}
	for i := range recs {
		get(recs[i].ID).Store = &recs[i]
	}
	for i := range onNode {
		get(onNode[i].ID).Node = &onNode[i]
	}
	slices.Sort(ids)
	for _, id := range ids {
		e := byID[id]
		e.Status = status(e, nodeOK)
		out.Sandboxes = append(out.Sandboxes, *e)
	}
	return out
}

func status(e *Entry, nodeOK bool) string {
	switch {
	case !nodeOK:
		return StatusNodeUnknown
	case e.Store == nil:
		return StatusUnknownToStore
	case e.Node == nil:
		if live(e.Store.State) {
			return StatusMissingOnNode
		}
		return StatusInSync
	case e.Node.Generation != e.Store.Generation || e.Node.State != e.Store.State:
		return StatusDrift
	}
	return StatusInSync
}

// Detail is the answer of Get.
type Detail struct {
	Sandbox     *SandboxRecord     `json:"sandbox,omitempty"`
	Generations []GenerationRecord `json:"generations,omitempty"`
	Operations  []OperationRecord  `json:"operations,omitempty"`
	Node        *api.Sandbox       `json:"node,omitempty"`
	NodeError   string             `json:"node_error,omitempty"`
}

// Get returns everything known about one sandbox; not_found only when
// neither the store nor the node knows it.
func (m *Manager) Get(ctx context.Context, id string) (Detail, error) {
	if err := names.CheckID("sandbox id", id); err != nil {
		return Detail{}, err
	}
	var d Detail
	sb, err := m.Store.Sandbox(ctx, id)
	switch {
	case err == nil:
		d.Sandbox = &sb
		if d.Generations, err = m.Store.Generations(ctx, id); err != nil {
			return d, err
		}
		if d.Operations, err = m.Store.Operations(ctx, id); err != nil {
			return d, err
		}
	case errdefs.CodeOf(err) != errdefs.CodeNotFound:
		return d, err
	}
	ns, nerr := m.NodeSandbox(ctx, id)
	switch {
	case nerr == nil:
		d.Node = &ns
	case errdefs.CodeOf(nerr) == errdefs.CodeNotFound && d.Sandbox == nil:
		return d, nerr
	case errdefs.CodeOf(nerr) != errdefs.CodeNotFound:
		d.NodeError = nerr.Error()
	}
	return d, nil
}

// NodeStatus is the answer of NodeStatus.
type NodeStatus struct {
	Node   api.Node   `json:"node"`
	Record NodeRecord `json:"record"`
}

// NodeStatus asks the node for its status and records the contact.
func (m *Manager) NodeStatus(ctx context.Context) (NodeStatus, error) {
	return m.contact(ctx)
}

// DefaultKeyOverlap is how long a node's key stays trusted for proofs
// after a signed rotation moved the pin (Manager.KeyOverlap).
const DefaultKeyOverlap = 24 * time.Hour

// rotate moves rec's pinned key to the key node n presents, iff n carries
// a rotation the pinned key (and the new key) signed; else the node is
// refused as before: conflict.
func (m *Manager) rotate(ctx context.Context, n api.Node, rec NodeRecord) (NodeRecord, error) {
	if n.KeyRotation == nil {
		return rec, errdefs.Errorf(errdefs.CodeConflict, "node %s presents key %x, not its pinned key %x, and no rotation signed by it", n.NodeID, n.NodeKey, rec.PublicKey)
	}
	kr := n.KeyRotation
	r := proof.Rotation{Version: kr.Version, NodeID: kr.NodeID, OldKey: kr.OldKey, NewKey: kr.NewKey, IssuedAt: kr.IssuedAt, OldSignature: kr.OldSignature, NewSignature: kr.NewSignature}
	if !bytes.Equal(r.NewKey, n.NodeKey) {
		return rec, errdefs.Errorf(errdefs.CodeConflict, "node %s presents key %x, but its rotation is to %x", n.NodeID, n.NodeKey, kr.NewKey)
	}
	if err := proof.VerifyRotation(r, n.NodeID, rec.PublicKey); err != nil {
		m.log().Error("node key rotation refused", "node", n.NodeID, "err", err)
		return rec, errdefs.Errorf(errdefs.CodeConflict, "node %s presents key %x, not its pinned key %x: %v", n.NodeID, n.NodeKey, rec.PublicKey, err)
	}
	overlap := m.KeyOverlap
	if overlap == 0 {
		overlap = DefaultKeyOverlap
	}
	out, err := m.Store.RotateNodeKey(ctx, n.NodeID, rec.PublicKey, r.NewKey, m.Store.now().Add(overlap))
	if err != nil {
		return rec, err
	}
	m.log().Info("node key rotated", "node", n.NodeID, "old_key", hex.EncodeToString(rec.PublicKey), "new_key", hex.EncodeToString(r.NewKey), "old_trusted_until", out.PreviousUntil)
	return out, nil
}
