package manager

import (
	"context"
	"crypto/ed25519"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/proof"
)

// Placement (issue 24): a create chooses a node and reserves its capacity
// in the one transaction that records the sandbox, its generation and the
// pending claim. The choice is made from a plain read of the nodes; then
// the chosen node's row is locked and the choice checked again on it as
// committed now (state, heartbeat, root mode, template, room), and only
// then is its reserved sum raised; a node that no longer fits is passed
// over for the next. So no two managers can overcommit a node whatever
// the interleaving, and placements on different nodes never wait for or
// abort each other: on PostgreSQL the transaction runs READ COMMITTED
// with those row locks (SERIALIZABLE, which every other transaction
// runs, aborted one of two concurrent placements: each read every node
// row the other wrote), and a node row another placement holds is skipped
// for the next best while there is one; SQLite runs write transactions
// one at a time. test/model/fleet.pml models this protocol. The node
// process of the chosen node takes the pending claim (NodeWork) and
// drives its ctld. The reservation comes back only by a release whose
// cleanup proof verifies against the node's pinned key and is clean
// (FinishPlacedRelease), or by a claim the node refused (FailPlacedClaim:
// nothing was leased).

// templateBonus is how much lighter a node that holds the claim's
// template looks to placement: it wins unless it is that much (a quarter
// of its capacity) more loaded than the lightest other node.
const templateBonus = 0.25

// PlaceIntent is a create to place: BeginClaim's intent without a node.
type PlaceIntent struct {
	SandboxID   string
	OperationID string // used only when no claim is pending
	Spec        Spec
}

// Placement is where a create was placed and its pending claim.
type Placement struct {
	NodeID    string          `json:"node_id"`
	Operation OperationRecord `json:"operation"`
	// Reused: a claim of the sandbox was already pending (a retry); it
	// and its node are returned, nothing new is reserved.
	Reused bool `json:"reused_operation"`
}

// need is what a claim reserves on its node.
func need(r api.Resources) NodeAlloc {
	return NodeAlloc{CPUMillis: r.CPUMillis, MemoryBytes: r.MemoryBytes, DiskBytes: r.DiskBytes, Sandboxes: 1}
}

// load is how full n would be with more on it: the fullest of its
// dimensions, as a fraction of what it can allocate.
func load(n FleetNode, more NodeAlloc) float64 {
	after := n.Reserved.add(n.Warm).add(more)
	l := 0.0
	for _, d := range [][2]int64{
		{after.CPUMillis, n.Allocatable.CPUMillis}, {after.MemoryBytes, n.Allocatable.MemoryBytes},
		{after.DiskBytes, n.Allocatable.DiskBytes}, {after.Sandboxes, n.Allocatable.Sandboxes},
	} {
		if d[1] > 0 {
			l = max(l, float64(d[0])/float64(d[1]))
		}
	}
	return l
}

// choose picks the node for a claim among nodes (plain data; the
// transaction reads them and records the choice): only ready nodes with a
// live heartbeat that run the claim's root mode (an overlay claim also
// needs its template on the node) and have room for it; of those the
// least loaded after placing it, a node holding the template counting
// templateBonus lighter; ties go to the lowest node id. No fit is
// capacity_exhausted, saying why each node was passed over.
func choose(nodes []FleetNode, want NodeAlloc, rf api.RootFS, now time.Time) (FleetNode, error) {
	fits, err := fitting(nodes, want, rf, now)
	if err != nil {
		return FleetNode{}, err
	}
	return fits[0], nil
}

// fitting is every node choose may pick, best first.
func fitting(nodes []FleetNode, want NodeAlloc, rf api.RootFS, now time.Time) ([]FleetNode, error) {
	mode := rf.Mode
	if mode == "" {
		mode = api.RootFSOverlay
	}
	var fits []FleetNode
	var why []string
	for _, n := range nodes {
		var reason string
		switch {
		case n.State != NodeReady:
			reason = n.State
		case now.After(n.Expires()):
			reason = "heartbeat expired"
		case !holds(n.RootModes, string(mode)):
			reason = "no " + string(mode) + " root"
		case mode == api.RootFSOverlay && rf.Template != "" && !holds(n.Templates, rf.Template):
			reason = "no template " + rf.Template
		case !n.Reserved.add(n.Warm).add(want).Fits(n.Allocatable):
			// The warm pool's members hold their share as leases do
			// (ctld admits over allocatable - leased - warm - withheld).
			reason = "full"
		}
		if reason != "" {
			why = append(why, n.NodeID+": "+reason)
			continue
		}
		fits = append(fits, n)
	}
	if len(fits) == 0 {
		if len(nodes) == 0 {
			why = append(why, "no node is registered")
		}
		return nil, errdefs.Errorf(errdefs.CodeCapacityExhausted, "no node can take the claim (%d cpu millis, %d memory bytes, %d disk bytes, %s %s): %s",
			want.CPUMillis, want.MemoryBytes, want.DiskBytes, mode, rf.Template, strings.Join(why, "; "))
	}
	score := func(n FleetNode) float64 {
		s := load(n, want)
		if rf.Template != "" && holds(n.Templates, rf.Template) {
			s -= templateBonus
		}
		return s
	}
	sort.SliceStable(fits, func(i, j int) bool {
		si, sj := score(fits[i]), score(fits[j])
		if si != sj {
			return si < sj
		}
		return fits[i].NodeID < fits[j].NodeID
	})
	return fits, nil
}

// Place chooses a node for the create and records, in one transaction,
// the sandbox on it, its next generation, the pending claim (the spec as
// its request) and the capacity reservation. A claim of the sandbox still
// pending is returned as it is (Reused); a sandbox that holds compute is a
// conflict; no room anywhere is capacity_exhausted.
func (s *Store) Place(ctx context.Context, in PlaceIntent) (Placement, error) {
	request, err := json.Marshal(in.Spec)
	if err != nil {
		return Placement{}, fmt.Errorf("encode the claim of %s: %w", in.SandboxID, err)
	}
	var out Placement
	err = s.txWith(ctx, s.dialect.lockingTxOpts, func(tx *sql.Tx) error {
		out = Placement{}
		// The sandbox's row first, made if new, then locked: creates of
		// one sandbox (a client's retry, two replicas) run one after the
		// other from here, each seeing what the one before committed.
		res, err := tx.ExecContext(ctx, `INSERT INTO sandboxes (id, created_at, state, generation) VALUES (?, ?, ?, 0) ON CONFLICT (id) DO NOTHING`,
			in.SandboxID, ts(s.now()), api.StateClaiming)
		if err != nil {
			return fmt.Errorf("record sandbox %s: %w", in.SandboxID, err)
		}
		made, err := res.RowsAffected()
		if err != nil {
			return fmt.Errorf("record sandbox %s: %w", in.SandboxID, err)
		}
		sb, err := scanSandbox(tx.QueryRowContext(ctx, sandboxSelect+` WHERE id = ?`+s.dialect.forUpdate, in.SandboxID))
		if err != nil {
			return fmt.Errorf("lock sandbox %s: %w", in.SandboxID, err)
		}
		pending, ok, err := pendingOp(ctx, tx, in.SandboxID, KindClaim)
		switch {
		case err != nil:
			return err
		case ok && made == 1:
			return errdefs.Errorf(errdefs.CodeConflict, "sandbox %s has a pending claim %s but no record", in.SandboxID, pending.OperationID)
		case ok:
			out = Placement{NodeID: sb.NodeID, Operation: pending, Reused: true}
			return nil
		case made == 0 && live(sb.State):
			return errdefs.Errorf(errdefs.CodeConflict, "sandbox %s is %s (generation %d); destroy it first", sb.ID, sb.State, sb.Generation)
		}
		out, err = s.placeTx(ctx, tx, in, request, sb, "")
		return err
	})
	if err == nil && !out.Reused {
		// After the commit, so the node's process finds the claim. A
		// failed notification is not the create's failure (the claim is
		// recorded; the node's polling finds it).
		_ = s.NotifyNode(ctx, out.NodeID)
	}
	return out, err
}

// placeTx chooses a node for in (sb: the sandbox's row, locked) and
// records the next generation on it, its pending claim (request) and its
// reservation; reason is recorded on the sandbox.
func (s *Store) placeTx(ctx context.Context, tx *sql.Tx, in PlaceIntent, request []byte, sb SandboxRecord, reason string) (Placement, error) {
	want := need(in.Spec.Resources)
	now := s.now()
	at := ts(now)
	gen := sb.Generation + 1
	// What does not name the node first: the node's row is locked from
	// reserveNode to the commit, and every placement on it waits for it.
	res, _ := json.Marshal(in.Spec.Resources)
	rootfs, _ := json.Marshal(in.Spec.RootFS)
	network, _ := json.Marshal(in.Spec.Network)
	if _, err := tx.ExecContext(ctx, `INSERT INTO generations (sandbox_id, generation, state, resources, rootfs, network, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		in.SandboxID, gen, api.StateClaiming, string(res), string(rootfs), string(network), at); err != nil {
		return Placement{}, fmt.Errorf("record generation %s/%d: %w", in.SandboxID, gen, err)
	}
	op, err := scanOperation(tx.QueryRowContext(ctx, `INSERT INTO operations (operation_id, kind, sandbox_id, generation, state, request, created_at) VALUES (?, 'claim', ?, ?, 'pending', ?, ?)
		RETURNING `+operationColumns, in.OperationID, in.SandboxID, gen, string(request), at))
	if err != nil {
		return Placement{}, fmt.Errorf("record operation %s: %w", in.OperationID, err)
	}
	// The rows that name the node are written for each candidate before
	// its row is locked: the lock is held only for the check, the sum's
	// update and the commit.
	recorded := ""
	record := func(nodeID string) error {
		if nodeID == recorded {
			return nil
		}
		if _, err := tx.ExecContext(ctx, `UPDATE sandboxes SET state = ?, generation = ?, node_id = ?, reason = ? WHERE id = ?`,
			api.StateClaiming, gen, nodeID, reason, in.SandboxID); err != nil {
			return fmt.Errorf("update sandbox %s: %w", in.SandboxID, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO reservations (sandbox_id, generation, node_id, cpu_millis, memory_bytes, disk_bytes, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (sandbox_id, generation) DO UPDATE SET node_id = excluded.node_id`,
			in.SandboxID, gen, nodeID, want.CPUMillis, want.MemoryBytes, want.DiskBytes, at); err != nil {
			return fmt.Errorf("reserve capacity of %s/%d on node %s: %w", in.SandboxID, gen, nodeID, err)
		}
		recorded = nodeID
		return nil
	}
	n, err := s.reserveNode(ctx, tx, want, in.Spec.RootFS, now, record)
	if err != nil {
		return Placement{}, err
	}
	return Placement{NodeID: n.NodeID, Operation: op}, nil
}

// skipTries and skipPause: how often, and how far apart, placement looks
// at a locked node row before passing the node over (a heartbeat holds it
// for a few milliseconds, a TCG-slow one for tens).
const (
	skipTries = 10
	skipPause = 20 * time.Millisecond
)

// errNoFree: no node fits that another placement does not hold.
var errNoFree = errors.New("no free node fits")

// reserveNode chooses the node for a claim of want (rf: its root) and
// adds want to that node's reserved sum. The choice is made from a plain
// read of the ready nodes, then checked again on the chosen node's row
// locked (as committed now): a node that no longer fits (filled or
// cordoned meanwhile) is passed over for the next choice, with the reason
// the row gave. Where the database can (PostgreSQL), a node row another
// placement has locked is passed over too while another node fits, so
// concurrent placements spread instead of queueing on the least loaded
// node; only when every fitting node is locked does it wait for one.
func (s *Store) reserveNode(ctx context.Context, tx *sql.Tx, want NodeAlloc, rf api.RootFS, now time.Time, record func(nodeID string) error) (FleetNode, error) {
	nodes, err := collect(ctx, tx, scanFleetNode, fleetSelect+` AND n.state = 'ready' ORDER BY n.node_id`)
	if err != nil {
		return FleetNode{}, fmt.Errorf("list nodes: %w", err)
	}
	if s.afterNodeRead != nil {
		s.afterNodeRead()
	}
	busy := map[string]bool{} // locked by another placement: tried last
	for {
		// The best node no other placement holds, locked if still free;
		// when every fitting node is held, any of them, waiting for its
		// lock (SQLite, which holds the database, takes the best).
		n, err := FleetNode{}, errNoFree
		lock := s.dialect.skipLocked
		if lock != "" {
			var free []FleetNode
			for _, n := range nodes {
				if !busy[n.NodeID] {
					free = append(free, n)
				}
			}
			n, err = choose(free, want, rf, now)
		}
		if err != nil {
			fits, err := fitting(nodes, want, rf, now)
			if err != nil {
				return FleetNode{}, err
			}
			// Waiting: on any fitting node, not all on the best one (a
			// queue there would serve one placement at a time while the
			// other nodes' rows come free).
			n, lock = fits[0], s.dialect.forUpdate
			if len(busy) > 0 {
				n = fits[rand.IntN(len(fits))]
			}
		}
		if err := record(n.NodeID); err != nil {
			return FleetNode{}, err
		}
		fresh, err := scanFleetNode(tx.QueryRowContext(ctx, fleetSelect+` AND n.node_id = ?`+lock, n.NodeID))
		for try := 1; errdefs.CodeOf(err) == errdefs.CodeNotFound && lock != s.dialect.forUpdate && try < skipTries; try++ {
			// A node's row is also held by its own heartbeat's short
			// transaction: look again a few times before passing the node
			// over as another placement's (once, every create beside a
			// heartbeat went to a busier node). Never a wait on the lock:
			// two placements each holding a row and waiting for the
			// other's would deadlock.
			select {
			case <-ctx.Done():
				return FleetNode{}, ctx.Err()
			case <-time.After(skipPause):
			}
			fresh, err = scanFleetNode(tx.QueryRowContext(ctx, fleetSelect+` AND n.node_id = ?`+lock, n.NodeID))
		}
		switch {
		case errdefs.CodeOf(err) == errdefs.CodeNotFound && lock != s.dialect.forUpdate:
			busy[n.NodeID] = true // another placement holds it (or it is gone)
			continue
		case errdefs.CodeOf(err) == errdefs.CodeNotFound:
			fresh = n
			fresh.State = "unregistered"
		case err != nil:
			return FleetNode{}, fmt.Errorf("lock node %s: %w", n.NodeID, err)
		}
		if _, err := choose([]FleetNode{fresh}, want, rf, now); err != nil {
			// The row as committed now does not fit: choose again, with it.
			for i := range nodes {
				if nodes[i].NodeID == fresh.NodeID {
					nodes[i] = fresh
				}
			}
			delete(busy, fresh.NodeID)
			continue
		}
		if lock != s.dialect.forUpdate && (fresh.Reserved != n.Reserved || fresh.Warm != n.Warm) {
			// Another placement committed on it since the read (READ
			// COMMITTED): choose again with its row as it is now, or two
			// concurrent creates land on one node while another is idle.
			// Its row stays locked by this transaction, so the next look
			// at it sees the same row and ends the loop.
			for i := range nodes {
				if nodes[i].NodeID == fresh.NodeID {
					nodes[i] = fresh
				}
			}
			delete(busy, fresh.NodeID)
			continue
		}
		if err := addReserved(ctx, tx, fresh.NodeID, want); err != nil {
			return FleetNode{}, err
		}
		return fresh, nil
	}
}

// maxNodeWork bounds one NodeWork answer; the node process asks again.
const maxNodeWork = 100

// NodeWork returns the pending claims and releases of the sandboxes placed
// on node nodeID, oldest first (at most maxNodeWork): what its node
// process has to carry out.
func (s *Store) NodeWork(ctx context.Context, nodeID string) ([]OperationRecord, error) {
	// An operation is the work of the node its generation is reserved on:
	// a stale generation's release goes to the node that ran it, not to
	// the node the sandbox was taken over by (takeover.go).
	out, err := collect(ctx, s.db, scanOperation, `SELECT o.operation_id, o.kind, o.sandbox_id, o.generation, o.state, o.request, o.error, o.created_at, o.finished_at
		FROM operations o JOIN sandboxes s ON s.id = o.sandbox_id
		LEFT JOIN reservations r ON r.sandbox_id = o.sandbox_id AND r.generation = o.generation
		WHERE COALESCE(r.node_id, s.node_id) = ? AND o.state = 'pending' ORDER BY o.created_at, o.operation_id LIMIT ?`, nodeID, maxNodeWork)
	if err != nil {
		return nil, fmt.Errorf("list the work of node %s: %w", nodeID, err)
	}
	return out, nil
}

// ClaimRequestOf is the claim a placed operation asks ctld for: its
// recorded spec with its operation id and generation.
func ClaimRequestOf(op OperationRecord) (api.ClaimRequest, error) {
	var spec Spec
	if err := json.Unmarshal(op.Request, &spec); err != nil {
		return api.ClaimRequest{}, fmt.Errorf("decode the claim of operation %s: %w", op.OperationID, err)
	}
	req := spec.claim(op.OperationID, op.Generation)
	if req.RootFS.Mode == api.RootFSBlock {
		// The database's writer epoch of the generation: the shared
		// store's head fences across nodes (takeOver raises it).
		req.RootFS.WriterEpoch = op.Generation
	}
	return req, nil
}

// Reservation is a placed generation's hold on its node's capacity.
type Reservation struct {
	SandboxID        string     `json:"sandbox_id"`
	Generation       uint64     `json:"generation"`
	NodeID           string     `json:"node_id"`
	Resources        NodeAlloc  `json:"resources"`
	CreatedAt        time.Time  `json:"created_at"`
	ReleasedAt       *time.Time `json:"released_at,omitempty"`
	ReleaseOperation string     `json:"release_operation,omitempty"`
}

func scanReservation(r rowScanner) (Reservation, error) {
	var v Reservation
	var created string
	var released sql.NullString
	if err := r.Scan(&v.SandboxID, &v.Generation, &v.NodeID, &v.Resources.CPUMillis, &v.Resources.MemoryBytes, &v.Resources.DiskBytes,
		&created, &released, &v.ReleaseOperation); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return v, notFound("no reservation")
		}
		return v, fmt.Errorf("read reservation: %w", err)
	}
	v.Resources.Sandboxes = 1
	var err error
	if v.CreatedAt, err = parseTS(created); err != nil {
		return v, err
	}
	v.ReleasedAt, err = parseNullTS(released)
	return v, err
}

const reservationSelect = `SELECT sandbox_id, generation, node_id, cpu_millis, memory_bytes, disk_bytes, created_at, released_at, release_operation FROM reservations`

// Reservations returns node nodeID's reservations, active and returned.
func (s *Store) Reservations(ctx context.Context, nodeID string) ([]Reservation, error) {
	out, err := collect(ctx, s.db, scanReservation, reservationSelect+` WHERE node_id = ? ORDER BY created_at, sandbox_id, generation`, nodeID)
	if err != nil {
		return nil, fmt.Errorf("list reservations of node %s: %w", nodeID, err)
	}
	return out, nil
}

// FailPlacedClaim records that the node refused a placed claim for good
// (ctld answers the same operation the same way again, and leased
// nothing): the generation fails and its reservation is returned.
func (s *Store) FailPlacedClaim(ctx context.Context, opID, msg string) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		op, err := scanOperation(tx.QueryRowContext(ctx, operationSelect+` WHERE operation_id = ?`, opID))
		if err != nil {
			return fmt.Errorf("fail claim %s: %w", opID, err)
		}
		if op.Kind != KindClaim || op.State != OpPending {
			return errdefs.Errorf(errdefs.CodeConflict, "fail claim %s: it is a %s %s", opID, op.State, op.Kind)
		}
		now := ts(s.now())
		for _, q := range []struct {
			sql  string
			args []any
		}{
			{`UPDATE generations SET state = ?, ended_at = ? WHERE sandbox_id = ? AND generation = ?`, []any{api.StateFailed, now, op.SandboxID, op.Generation}},
			{`UPDATE sandboxes SET state = ?, reason = ? WHERE id = ? AND generation = ?`, []any{api.StateFailed, msg, op.SandboxID, op.Generation}},
		} {
			if _, err := tx.ExecContext(ctx, q.sql, q.args...); err != nil {
				return fmt.Errorf("fail claim %s: %w", opID, err)
			}
		}
		if err := returnReservation(ctx, tx, op, now); err != nil {
			return err
		}
		return finishOp(ctx, tx, opID, OpFailed, msg, now)
	})
}

// FinishPlacedRelease records a placed sandbox's release and its cleanup
// proof, and judges the proof in the same transaction against the pinned
// key of the node the sandbox is placed on (internal/proof): it must be
// about this operation, sandbox, generation and node, signed by a key the
// node's record trusts now, and clean. Only then is the reservation
// returned; otherwise the proof is stored with the reason and the
// capacity stays held (the node withholds it too until a clean proof).
// A repeat of a finished release returns the stored record.
func (s *Store) FinishPlacedRelease(ctx context.Context, opID string, sb api.Sandbox, p api.CleanupProof) (ProofRecord, error) {
	var out ProofRecord
	err := s.tx(ctx, func(tx *sql.Tx) error {
		op, err := scanOperation(tx.QueryRowContext(ctx, operationSelect+` WHERE operation_id = ?`, opID))
		if err != nil {
			return fmt.Errorf("finish release %s: %w", opID, err)
		}
		if op.Kind != KindRelease {
			return errdefs.Errorf(errdefs.CodeConflict, "finish release %s: it is a %s", opID, op.Kind)
		}
		res, err := scanReservation(tx.QueryRowContext(ctx, reservationSelect+` WHERE sandbox_id = ? AND generation = ?`, op.SandboxID, op.Generation))
		if err != nil {
			return fmt.Errorf("finish release %s of %s/%d: %w", opID, op.SandboxID, op.Generation, err)
		}
		if op.State != OpPending {
			out, err = proofTx(ctx, tx, opID)
			return err
		}
		node, err := scanNode(tx.QueryRowContext(ctx, nodeSelect+` WHERE node_id = ?`, res.NodeID))
		if err != nil {
			return fmt.Errorf("finish release %s: node %s: %w", opID, res.NodeID, err)
		}
		now := s.now()
		out = ProofRecord{OperationID: opID, SandboxID: op.SandboxID, Generation: op.Generation, Proof: p}
		out.VerifyError = judgeProof(p, op, node, now)
		out.Verified = out.VerifyError == "" || strings.HasPrefix(out.VerifyError, notCleanPrefix)
		state := sb.State
		if state == "" {
			state = api.StateReleased
		}
		at := ts(now)
		if _, err := tx.ExecContext(ctx, `UPDATE generations SET state = ?, ended_at = ? WHERE sandbox_id = ? AND generation = ?`,
			state, at, op.SandboxID, op.Generation); err != nil {
			return fmt.Errorf("update generation %s/%d: %w", op.SandboxID, op.Generation, err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE sandboxes SET state = ? WHERE id = ? AND generation = ?`, state, op.SandboxID, op.Generation); err != nil {
			return fmt.Errorf("update sandbox %s: %w", op.SandboxID, err)
		}
		if err := finishOp(ctx, tx, opID, OpDone, "", at); err != nil {
			return err
		}
		if out.VerifyError == "" {
			if err := returnReservation(ctx, tx, op, at); err != nil {
				return err
			}
		}
		return saveProof(ctx, tx, out)
	})
	return out, err
}

// addReserved moves node nodeID's reserved sum by d (negative: returned).
func addReserved(ctx context.Context, tx *sql.Tx, nodeID string, d NodeAlloc) error {
	if _, err := tx.ExecContext(ctx, `UPDATE nodes SET reserved_cpu_millis = reserved_cpu_millis + ?, reserved_memory_bytes = reserved_memory_bytes + ?,
		reserved_disk_bytes = reserved_disk_bytes + ?, reserved_sandboxes = reserved_sandboxes + ? WHERE node_id = ?`,
		d.CPUMillis, d.MemoryBytes, d.DiskBytes, d.Sandboxes, nodeID); err != nil {
		return fmt.Errorf("count the reservations of node %s: %w", nodeID, err)
	}
	return nil
}

// returnReservation ends op's generation's reservation, if still active,
// by op, and takes it off its node's sum.
func returnReservation(ctx context.Context, tx *sql.Tx, op OperationRecord, at string) error {
	res, err := scanReservation(tx.QueryRowContext(ctx, reservationSelect+` WHERE sandbox_id = ? AND generation = ?`, op.SandboxID, op.Generation))
	if errdefs.CodeOf(err) == errdefs.CodeNotFound {
		return nil
	}
	if err != nil {
		return fmt.Errorf("return the reservation of %s/%d: %w", op.SandboxID, op.Generation, err)
	}
	if res.ReleasedAt != nil {
		return nil
	}
	if _, err := tx.ExecContext(ctx, `UPDATE reservations SET released_at = ?, release_operation = ? WHERE sandbox_id = ? AND generation = ?`,
		at, op.OperationID, op.SandboxID, op.Generation); err != nil {
		return fmt.Errorf("return the reservation of %s/%d: %w", op.SandboxID, op.Generation, err)
	}
	r := res.Resources
	return addReserved(ctx, tx, res.NodeID, NodeAlloc{-r.CPUMillis, -r.MemoryBytes, -r.DiskBytes, -1})
}

const notCleanPrefix = "not clean: "

// judgeProof says what is wrong with p as the proof of op's release on
// node ("" if nothing): the checks Manager.judge makes, against the key
// the store has pinned, with no trust on first use (a registered node's
// key is pinned at registration).
func judgeProof(p api.CleanupProof, op OperationRecord, node NodeRecord, now time.Time) string {
	switch {
	case p.OperationID != op.OperationID:
		return fmt.Sprintf("proof is for operation %q, not %q", p.OperationID, op.OperationID)
	case p.SandboxID != op.SandboxID:
		return fmt.Sprintf("proof is for sandbox %q, not %q", p.SandboxID, op.SandboxID)
	case p.Generation != op.Generation:
		return fmt.Sprintf("proof is for generation %d, not %d", p.Generation, op.Generation)
	case p.NodeID != node.NodeID:
		return fmt.Sprintf("proof is from node %q, not %q", p.NodeID, node.NodeID)
	}
	keys := node.TrustedKeys(now)
	if len(keys) == 0 {
		return fmt.Sprintf("node %s has no pinned key", node.NodeID)
	}
	var verr error
	for _, k := range keys {
		if verr = proof.Verify(p.Record(), ed25519.PublicKey(k)); verr == nil {
			break
		}
	}
	if verr != nil {
		return fmt.Sprintf("not signed by the pinned key of node %s: %v", node.NodeID, verr)
	}
	var failed []string
	for _, c := range p.Checks {
		if !c.OK {
			failed = append(failed, c.Name)
		}
	}
	if !p.Clean || len(failed) > 0 || len(p.Checks) == 0 {
		return notCleanPrefix + "failed checks: " + strings.Join(failed, ", ")
	}
	return ""
}

func proofTx(ctx context.Context, q querier, opID string) (ProofRecord, error) {
	var r ProofRecord
	var js string
	err := q.QueryRowContext(ctx, `SELECT operation_id, sandbox_id, generation, json, verified, verify_error FROM proofs WHERE operation_id = ?`, opID).
		Scan(&r.OperationID, &r.SandboxID, &r.Generation, &js, &r.Verified, &r.VerifyError)
	if errors.Is(err, sql.ErrNoRows) {
		return r, errdefs.Errorf(errdefs.CodeConflict, "release %s is finished without a proof", opID)
	}
	if err != nil {
		return r, fmt.Errorf("read proof %s: %w", opID, err)
	}
	if err := json.Unmarshal([]byte(js), &r.Proof); err != nil {
		return r, fmt.Errorf("decode proof %s: %w", opID, err)
	}
	return r, nil
}

// Definitive reports whether ctld's answer settles an operation (see
// definitive): the node process fails the operation on such an answer and
// leaves it pending, to send again with the same id, on any other.
func Definitive(err error) bool { return definitive(err) }

// NodeWorkChannel is the PostgreSQL notification channel on which a
// node's id is sent when work is placed on it (NotifyNode); node processes
// LISTEN on it to cut their polling wait.
const NodeWorkChannel = "ctl_node_work"

// NotifyNode wakes node nodeID's process (PostgreSQL: NOTIFY on
// NodeWorkChannel; SQLite has no other process to wake). It is a hint
// only: a lost notification costs one polling interval.
func (s *Store) NotifyNode(ctx context.Context, nodeID string) error {
	if s.dialect.name != pgDialect.name || nodeID == "" {
		return nil
	}
	if _, err := s.db.ExecContext(ctx, `SELECT pg_notify(?, ?)`, NodeWorkChannel, nodeID); err != nil {
		return fmt.Errorf("notify node %s: %w", nodeID, err)
	}
	return nil
}

// RequestRelease records the release of a placed sandbox (BeginRelease)
// and wakes its node's process, which carries it out.
func (s *Store) RequestRelease(ctx context.Context, id, newOpID string) (OperationRecord, bool, error) {
	op, reused, err := s.BeginRelease(ctx, id, newOpID)
	if err != nil {
		return op, reused, err
	}
	// A hint, as in Place: the release is recorded either way.
	if sb, err := s.Sandbox(ctx, id); err == nil {
		_ = s.NotifyNode(ctx, sb.NodeID)
	}
	return op, reused, nil
}
