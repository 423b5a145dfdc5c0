// Package nodeagent is the node process of the fleet (ctl-manager node
// run): next to one ctld, it registers the node in the manager's database
// (identity, pinned key, capacity and versions read from ctld's API over
// its local Unix socket), heartbeats with a TTL, takes the claims and
// releases placed on its node, drives ctld through them, and records the
// answers and cleanup proofs. ctld's socket stays local: only this process
// calls it. Work is found by polling the database; on PostgreSQL a
// LISTEN/NOTIFY wake-up (ListenDSN) cuts the wait.
package nodeagent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/logging"
	"github.com/ctld/ctld/internal/manager"
)

// Agent is one node's process. Store and Client are required; the rest
// has defaults.
type Agent struct {
	Store  *manager.Store
	Client *api.Client
	Log    *slog.Logger

	// Name is the node's name for operators (default: its id).
	Name string
	// Platform is runsc's platform on this node (ctld does not report it).
	Platform string
	// Templates are the templates this node holds locally.
	Templates []string
	// MaxSandboxes bounds the sandboxes placed here; 0: one per address of
	// ctld's pool (each sandbox takes one).
	MaxSandboxes int64
	// TTL is how long a heartbeat keeps the node alive (default 15s); the
	// agent heartbeats every TTL/3.
	TTL time.Duration
	// Grace is how long past its TTL a silent node is left before this
	// agent's sweep marks it lost (default 2*TTL). Every node process
	// sweeps (an idempotent transaction), so no single process must.
	Grace time.Duration
	// Poll is how often the database is asked for work (default 1s).
	Poll time.Duration
	// MaxConcurrent bounds the operations carried out at once (default 8,
	// ctld's default of concurrent claims); a sandbox's run one by one.
	MaxConcurrent int
	// Channel is the host:port managers reach this node's stream channel
	// on (nodechannel; registered with the node). Empty: none.
	Channel string
	// ListenDSN, a postgres:// URL (the Store's database), makes the agent
	// LISTEN for the notifications Place and RequestRelease send, so work
	// is taken at once rather than at the next poll. Empty: polling only.
	ListenDSN string
	// UsagePull is how often ctld's metering stream is paged into the
	// database's usage records (exits.go; 0: never).
	UsagePull time.Duration
}

func (a *Agent) log() *slog.Logger { return logging.OrDiscard(a.Log) }

func (a *Agent) ttl() time.Duration {
	if a.TTL > 0 {
		return a.TTL
	}
	return 15 * time.Second
}

func (a *Agent) grace() time.Duration {
	if a.Grace > 0 {
		return a.Grace
	}
	return 2 * a.ttl()
}

func (a *Agent) poll() time.Duration {
	if a.Poll > 0 {
		return a.Poll
	}
	return time.Second
}

// registration is what the node says of itself, from ctld's answer
// (plain data: tested without a ctld).
func (a *Agent) registration(n api.Node) (manager.Registration, error) {
	if n.NodeID == "" || len(n.NodeKey) == 0 {
		return manager.Registration{}, errors.New("ctld names no node id or key")
	}
	alloc := n.Capacity.Allocatable
	sandboxes := a.sandboxes(alloc)
	modes := []string{string(api.RootFSOverlay)}
	if alloc.NBDDevices > 0 {
		modes = append(modes, string(api.RootFSBlock))
	}
	name := a.Name
	if name == "" {
		name = n.NodeID
	}
	return manager.Registration{
		NodeID: n.NodeID, Name: name, PublicKey: n.NodeKey,
		Allocatable:  manager.NodeAlloc{CPUMillis: alloc.CPUMillis, MemoryBytes: alloc.MemoryBytes, DiskBytes: alloc.DiskBytes, Sandboxes: sandboxes},
		Warm:         a.warm(n),
		RunscVersion: n.Versions.Runsc, Platform: a.Platform, RootModes: modes, Templates: a.Templates, TTL: a.ttl(),
		Channel: a.Channel,
	}, nil
}

// sandboxes is how many sandboxes the node may be placed: one per
// address of its pool, within the operator's bound.
func (a *Agent) sandboxes(alloc api.Capacity) int64 {
	sandboxes := alloc.Addresses
	if a.MaxSandboxes > 0 && (sandboxes == 0 || a.MaxSandboxes < sandboxes) {
		sandboxes = a.MaxSandboxes
	}
	return sandboxes
}

// warm is what ctld's warm pool holds (its ledger's warm row), as
// placement counts it beside the reservations: each member's CPU, memory
// and disk, and its address where the addresses left would not cover the
// sandboxes registered (plain data).
func (a *Agent) warm(n api.Node) manager.NodeAlloc {
	w, alloc := n.Capacity.Warm, n.Capacity.Allocatable
	sandboxes := w.Addresses
	if alloc.Addresses > 0 {
		sandboxes = max(0, w.Addresses-(alloc.Addresses-a.sandboxes(alloc)))
	}
	return manager.NodeAlloc{CPUMillis: w.CPUMillis, MemoryBytes: w.MemoryBytes, DiskBytes: w.DiskBytes, Sandboxes: sandboxes}
}

// Register reads the node from ctld and registers it.
func (a *Agent) Register(ctx context.Context) (manager.FleetNode, error) {
	n, err := a.Client.Node(ctx)
	if err != nil {
		return manager.FleetNode{}, fmt.Errorf("ask ctld who it is: %w", err)
	}
	r, err := a.registration(n)
	if err != nil {
		return manager.FleetNode{}, fmt.Errorf("register node: %w", err)
	}
	rec, err := a.Store.RegisterNode(ctx, r)
	if err != nil {
		return rec, fmt.Errorf("register node %s: %w", n.NodeID, err)
	}
	a.log().Info("node registered", "node", rec.NodeID, "state", rec.State, "allocatable", rec.Allocatable, "root_modes", rec.RootModes, "templates", rec.Templates)
	if err := a.reconcile(ctx, rec.NodeID); err != nil {
		a.log().Warn("reconcile what the database failed or lost on this node", "node", rec.NodeID, "err", err)
	}
	a.releaseStale(ctx, rec.NodeID)
	return rec, nil
}

// releaseAbandoned records a release of each sandbox the database failed
// on this node while ctld still runs its generation, as when the
// node was marked lost and came back: the next steps carry them out and
// their verified proofs return the capacity. A generation ctld no longer
// has is left held (its proof is not here) and logged.
func (a *Agent) releaseAbandoned(ctx context.Context, nodeID string) error {
	recs, err := a.Store.Abandoned(ctx, nodeID)
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range recs {
		sb, err := a.Client.Get(ctx, r.ID)
		if err != nil || sb.Generation != r.Generation || sb.State != api.StateReady {
			a.log().Warn("abandoned generation not running on ctld; its capacity stays held", "sandbox", r.ID, "generation", r.Generation, "ctld", sb.State, "err", err)
			continue
		}
		opID, err := newOpID()
		if err == nil {
			_, _, err = a.Store.BeginRelease(ctx, r.ID, opID)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("release abandoned %s: %w", r.ID, err))
			continue
		}
		a.log().Info("releasing a generation the database no longer gives this node", "sandbox", r.ID, "generation", r.Generation, "was", r.State)
	}
	return errors.Join(errs...)
}

// releaseStale records a release of each generation this node still
// holds while the database gave its sandbox to a newer generation (taken
// over elsewhere while this node was lost); the next steps carry them out
// on ctld, and each verified proof returns the capacity.
func (a *Agent) releaseStale(ctx context.Context, nodeID string) {
	stale, err := a.Store.ReleaseStale(ctx, nodeID, newOpID)
	if err != nil {
		a.log().Warn("release the generations taken over elsewhere", "node", nodeID, "err", err)
	}
	for _, g := range stale {
		a.log().Info("releasing a generation the database gave to another", "sandbox", g.SandboxID, "generation", g.Generation, "operation", g.Operation.OperationID)
	}
}

// publishHead records the head a pause sealed, unless it is recorded
// already (this pause's answer seen before).
func (a *Agent) publishHead(ctx context.Context, nodeID string, op manager.OperationRecord, h api.VolumeHead) error {
	cur, err := a.Store.Head(ctx, op.SandboxID)
	if err != nil {
		return err
	}
	if cur.Seq == h.Seq && cur.Generation == h.Generation {
		return nil
	}
	if err := a.Store.PublishPlacedHead(ctx, nodeID, op.SandboxID, op.Generation, h); err != nil {
		return err
	}
	a.log().Info("head recorded", "sandbox", op.SandboxID, "generation", op.Generation, "head", h.Seq, "block_generation", h.Generation)
	return nil
}

func newOpID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generate operation id: %w", err)
	}
	return "op-" + hex.EncodeToString(b[:]), nil
}

// Run registers the node, then heartbeats, sweeps for lost nodes, records
// its ctld's exits and usage (exits.go) and carries out the node's work
// until ctx ends. A registration refused for good (another key pinned for this id) ends it with that error.
// Heartbeats run on their own: a claim takes seconds (runsc), and a node
// busy with its work must not look silent. The work runs up to
// MaxConcurrent operations at once, one at a time per sandbox.
func (a *Agent) Run(ctx context.Context) error {
	rec, err := a.Register(ctx)
	if err != nil {
		return err
	}
	id := rec.NodeID
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wake chan struct{} // nil: never ready
	if manager.IsPostgresURL(a.ListenDSN) {
		wake = make(chan struct{}, 1)
		wg.Add(1)
		go func() { defer wg.Done(); listen(ctx, a.ListenDSN, id, a.log(), wake) }()
	}
	wg.Add(2)
	go func() { defer wg.Done(); a.watchExits(ctx, id) }()
	go func() { defer wg.Done(); a.pullUsage(ctx) }()
	wg.Add(1)
	go func() {
		defer wg.Done()
		beat := time.NewTicker(a.ttl() / 3)
		defer beat.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-beat.C:
				if err := a.heartbeat(ctx, id); err != nil && ctx.Err() == nil {
					a.log().Warn("heartbeat", "node", id, "err", err)
				}
			}
		}
	}()
	poll := time.NewTicker(a.poll())
	defer poll.Stop()
	w := &workers{a: a, node: id, busy: map[string]bool{}, done: make(chan struct{}, 1)}
	for {
		if err := w.dispatch(ctx, &wg); err != nil && ctx.Err() == nil {
			a.log().Warn("node work", "node", id, "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-poll.C:
		case <-wake:
		case <-w.done:
		}
	}
}

// workers runs a node's operations concurrently, one per sandbox.
type workers struct {
	a    *Agent
	node string
	mu   sync.Mutex
	busy map[string]bool // sandboxes with an operation running
	done chan struct{}   // an operation settled: look for more
}

func (w *workers) dispatch(ctx context.Context, wg *sync.WaitGroup) error {
	work, err := w.a.Store.NodeWork(ctx, w.node)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, op := range work {
		if len(w.busy) >= w.a.maxConcurrent() {
			break
		}
		if w.busy[op.SandboxID] {
			continue
		}
		w.busy[op.SandboxID] = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := w.a.do(ctx, w.node, op)
			if err != nil && ctx.Err() == nil {
				w.a.log().Warn("node work", "node", w.node, "operation", op.OperationID, "err", err)
			}
			w.mu.Lock()
			delete(w.busy, op.SandboxID)
			w.mu.Unlock()
			if err == nil {
				// Settled: the sandbox's next operation may wait. One left
				// pending is tried again at the next poll, not at once.
				select {
				case w.done <- struct{}{}:
				default:
				}
			}
		}()
	}
	return nil
}

// beat is one heartbeat, carrying what ctld's warm pool holds now
// (placement counts it). ctld's answer is bounded by a third of the TTL;
// without one the heartbeat keeps the last warm row it recorded.
func (a *Agent) beat(ctx context.Context, id string) (manager.FleetNode, error) {
	cctx, cancel := context.WithTimeout(ctx, a.ttl()/3)
	n, err := a.Client.Node(cctx)
	cancel()
	if err != nil || n.NodeID != id {
		a.log().Debug("heartbeat without ctld's warm pool", "node", id, "ctld_node", n.NodeID, "err", err)
		return a.Store.Heartbeat(ctx, id)
	}
	return a.Store.HeartbeatWarm(ctx, id, a.warm(n))
}

func (a *Agent) maxConcurrent() int {
	if a.MaxConcurrent > 0 {
		return a.MaxConcurrent
	}
	return 8
}

// heartbeat renews the node's TTL (registering again if the node was
// marked lost meanwhile) and sweeps the fleet for lost nodes.
func (a *Agent) heartbeat(ctx context.Context, id string) error {
	_, err := a.beat(ctx, id)
	if errdefs.CodeOf(err) == errdefs.CodeFenced || errdefs.CodeOf(err) == errdefs.CodeNotFound {
		a.log().Warn("node was marked lost or forgotten; registering again", "node", id, "err", err)
		_, err = a.Register(ctx)
	} else if err == nil {
		if rerr := a.reconcile(ctx, id); rerr != nil && ctx.Err() == nil {
			a.log().Warn("reconcile what the database failed or lost on this node", "node", id, "err", rerr)
		}
	}
	if err != nil {
		return err
	}
	lost, err := a.Store.MarkLostNodes(ctx, a.grace())
	for _, l := range lost {
		a.log().Warn("node marked lost", "node", l.NodeID, "reason", l.Reason, "failed", l.Failed, "lost", l.Lost)
	}
	if err != nil {
		return err
	}
	// Lost block sandboxes (of this sweep or an earlier one that found no
	// room) resume elsewhere from their committed head.
	moved, errs := a.Store.TakeOverLost(ctx, newOpID)
	for _, t := range moved {
		a.log().Warn("lost block sandbox resumed on another node", "sandbox", t.SandboxID, "from", t.From, "from_generation", t.FromGen,
			"to", t.NodeID, "generation", t.Operation.Generation, "head", t.Head.Seq)
	}
	return errors.Join(errs...)
}

// Step carries out the pending operations placed on node id, oldest
// first, and returns how many it settled. An answer that does not settle
// an operation (ctld unreachable, busy) leaves it pending for the next
// step, which sends it again with the same operation id.
func (a *Agent) Step(ctx context.Context, id string) (int, error) {
	work, err := a.Store.NodeWork(ctx, id)
	if err != nil {
		return 0, err
	}
	done := 0
	var errs []error
	for _, op := range work {
		if ctx.Err() != nil {
			break
		}
		if err := a.do(ctx, id, op); err != nil {
			errs = append(errs, err)
			continue
		}
		done++
	}
	return done, errors.Join(errs...)
}

// do carries out one operation of node nodeID.
func (a *Agent) do(ctx context.Context, nodeID string, op manager.OperationRecord) error {
	switch op.Kind {
	case manager.KindClaim:
		return a.claim(ctx, nodeID, op)
	case manager.KindRelease:
		return a.release(ctx, nodeID, op)
	}
	return fmt.Errorf("operation %s: unknown kind %q", op.OperationID, op.Kind)
}

func (a *Agent) claim(ctx context.Context, nodeID string, op manager.OperationRecord) error {
	req, err := manager.ClaimRequestOf(op)
	if err != nil {
		return errors.Join(err, a.Store.FailPlacedClaim(ctx, op.OperationID, "internal: "+err.Error()))
	}
	resp, err := a.Client.Claim(ctx, op.SandboxID, req)
	switch {
	case err == nil:
		ferr := a.Store.FinishPlacedClaim(ctx, nodeID, op.OperationID, resp.Sandbox)
		if errdefs.CodeOf(ferr) == errdefs.CodeFenced {
			// The database gave the sandbox to another generation while
			// ctld made this one: release it.
			a.log().Warn("claim answered too late; releasing it", "sandbox", op.SandboxID, "generation", op.Generation, "err", ferr)
			a.releaseStale(ctx, nodeID)
			return nil
		}
		if ferr != nil {
			return fmt.Errorf("record claim %s: %w", op.OperationID, ferr)
		}
		a.log().Info("claimed", "sandbox", op.SandboxID, "generation", op.Generation, "operation", op.OperationID)
		return nil
	case manager.Definitive(err):
		a.log().Warn("claim refused", "sandbox", op.SandboxID, "operation", op.OperationID, "err", err)
		if ferr := a.Store.FailPlacedClaim(ctx, op.OperationID, err.Error()); ferr != nil {
			return fmt.Errorf("record refused claim %s: %w", op.OperationID, ferr)
		}
		return nil
	}
	return fmt.Errorf("claim %s of %s (left pending): %w", op.OperationID, op.SandboxID, err)
}

func (a *Agent) release(ctx context.Context, nodeID string, op manager.OperationRecord) error {
	var resp api.ReleaseResponse
	var err error
	if manager.IsPause(op) {
		var pr api.PauseResponse
		pr, err = a.Client.Pause(ctx, op.SandboxID, api.PauseRequest{OperationID: op.OperationID, Generation: op.Generation})
		if err == nil {
			// The head first: the release's record ends the generation,
			// and a head is recorded only for the generation the node
			// holds. A repeat (the same answer again) finds it recorded.
			if herr := a.publishHead(ctx, nodeID, op, pr.Head); herr != nil {
				return fmt.Errorf("record the head of pause %s (left pending): %w", op.OperationID, herr)
			}
		}
		resp = api.ReleaseResponse{Sandbox: pr.Sandbox, Proof: pr.Proof}
	} else {
		resp, err = a.Client.Release(ctx, op.SandboxID, api.ReleaseRequest{OperationID: op.OperationID, Generation: op.Generation})
	}
	if errdefs.CodeOf(err) == errdefs.CodeConflict {
		// Perhaps ctld released the generation itself.
		if done, nerr := a.recordNodeRelease(ctx, op); done || nerr != nil {
			return nerr
		}
	}
	switch {
	case err == nil:
		rec, err := a.Store.FinishPlacedRelease(ctx, op.OperationID, resp.Sandbox, resp.Proof)
		if err != nil {
			return fmt.Errorf("record release %s: %w", op.OperationID, err)
		}
		if rec.VerifyError != "" {
			a.log().Warn("release proof not accepted; capacity stays reserved", "sandbox", op.SandboxID, "operation", op.OperationID, "reason", rec.VerifyError)
		} else {
			a.log().Info("released", "sandbox", op.SandboxID, "generation", op.Generation, "operation", op.OperationID)
		}
		return nil
	case manager.Definitive(err):
		a.log().Warn("release refused", "sandbox", op.SandboxID, "operation", op.OperationID, "err", err)
		if ferr := a.Store.FailOperation(ctx, op.OperationID, err.Error()); ferr != nil {
			return fmt.Errorf("record refused release %s: %w", op.OperationID, ferr)
		}
		return nil
	}
	return fmt.Errorf("release %s of %s (left pending): %w", op.OperationID, op.SandboxID, err)
}
