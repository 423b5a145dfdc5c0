package manager

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/names"
)

// The fleet's nodes (issue 24): a node process next to each ctld registers
// the node with its pinned key, its allocatable capacity and what it can
// run, and heartbeats with a TTL. Placement (placement.go) reserves
// capacity only on ready nodes; a node whose heartbeat lapses past a grace
// is marked lost in one transaction that also fails its overlay
// sandboxes. A row of the nodes table with state "" is a node the
// single-node manager contacted directly (PinNode), not a fleet member.

// Node states of the fleet.
const (
	NodeReady    = "ready"
	NodeCordoned = "cordoned"
	NodeDraining = "draining"
	NodeLost     = "lost"
)

// fleetMigration extends the nodes table with what a registration says
// and adds the capacity reservations of placed sandboxes. A reservation is
// active until released_at is set: by a release whose cleanup proof
// verified against the node's pinned key, or a claim the node refused.
// The node's reserved_* columns are the sum of its active reservations,
// kept in the same transactions (placement reads them, not the rows, so
// its cost does not grow with the sandboxes recorded).
const fleetMigration = `ALTER TABLE nodes ADD COLUMN name TEXT NOT NULL DEFAULT '';
	ALTER TABLE nodes ADD COLUMN state TEXT NOT NULL DEFAULT '' CHECK (state IN ('', 'ready', 'cordoned', 'draining', 'lost'));
	ALTER TABLE nodes ADD COLUMN state_reason TEXT NOT NULL DEFAULT '';
	ALTER TABLE nodes ADD COLUMN alloc_cpu_millis INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE nodes ADD COLUMN alloc_memory_bytes INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE nodes ADD COLUMN alloc_disk_bytes INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE nodes ADD COLUMN alloc_sandboxes INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE nodes ADD COLUMN runsc_version TEXT NOT NULL DEFAULT '';
	ALTER TABLE nodes ADD COLUMN platform TEXT NOT NULL DEFAULT '';
	ALTER TABLE nodes ADD COLUMN root_modes TEXT NOT NULL DEFAULT '[]';
	ALTER TABLE nodes ADD COLUMN templates TEXT NOT NULL DEFAULT '[]';
	ALTER TABLE nodes ADD COLUMN heartbeat_at TEXT NOT NULL DEFAULT '';
	ALTER TABLE nodes ADD COLUMN ttl_ms INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE nodes ADD COLUMN reserved_cpu_millis INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE nodes ADD COLUMN reserved_memory_bytes INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE nodes ADD COLUMN reserved_disk_bytes INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE nodes ADD COLUMN reserved_sandboxes INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE sandboxes ADD COLUMN reason TEXT NOT NULL DEFAULT '';
	CREATE TABLE reservations (
		sandbox_id        TEXT NOT NULL,
		generation        INTEGER NOT NULL,
		node_id           TEXT NOT NULL REFERENCES nodes(node_id),
		cpu_millis        INTEGER NOT NULL,
		memory_bytes      INTEGER NOT NULL,
		disk_bytes        INTEGER NOT NULL,
		created_at        TEXT NOT NULL,
		released_at       TEXT,
		release_operation TEXT NOT NULL DEFAULT '',
		PRIMARY KEY (sandbox_id, generation),
		FOREIGN KEY (sandbox_id, generation) REFERENCES generations(sandbox_id, generation)
	);
	CREATE INDEX reservations_by_node ON reservations(node_id, released_at);`

// warmMigration: the capacity a node's warm pool holds (pre-booted
// guests, ctld's `warm` row), as its node process last reported it:
// placement counts it beside the reservations, so a node whose members
// fill it is not chosen for a claim its ctld would refuse.
const warmMigration = `ALTER TABLE nodes ADD COLUMN warm_cpu_millis INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE nodes ADD COLUMN warm_memory_bytes INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE nodes ADD COLUMN warm_disk_bytes INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE nodes ADD COLUMN warm_sandboxes INTEGER NOT NULL DEFAULT 0;`

// NodeAlloc is an amount of a node's capacity: allocatable, or reserved
// by placed sandboxes (each counts one of Sandboxes).
type NodeAlloc struct {
	CPUMillis   int64 `json:"cpu_millis"`
	MemoryBytes int64 `json:"memory_bytes"`
	DiskBytes   int64 `json:"disk_bytes"`
	Sandboxes   int64 `json:"sandboxes"`
}

// Fits reports whether a fits within limit in every dimension.
func (a NodeAlloc) Fits(limit NodeAlloc) bool {
	return a.CPUMillis <= limit.CPUMillis && a.MemoryBytes <= limit.MemoryBytes &&
		a.DiskBytes <= limit.DiskBytes && a.Sandboxes <= limit.Sandboxes
}

func (a NodeAlloc) negative() bool {
	return a.CPUMillis < 0 || a.MemoryBytes < 0 || a.DiskBytes < 0 || a.Sandboxes < 0
}

func (a NodeAlloc) add(b NodeAlloc) NodeAlloc {
	return NodeAlloc{a.CPUMillis + b.CPUMillis, a.MemoryBytes + b.MemoryBytes, a.DiskBytes + b.DiskBytes, a.Sandboxes + b.Sandboxes}
}

// Registration is what a node process says of its node when it registers.
type Registration struct {
	NodeID string
	Name   string
	// PublicKey is ctld's proof-signing key (ed25519): pinned by the first
	// registration; a later one with another key is refused.
	PublicKey    []byte
	Allocatable  NodeAlloc
	RunscVersion string
	Platform     string
	// RootModes the node can run ("overlay", "block").
	RootModes []string
	// Templates the node holds locally: an overlay claim runs only on a
	// node that holds its template; a block claim prefers one (its blocks
	// are cached there) but any block node can fetch them.
	Templates []string
	// Warm is what the node's warm pool holds now (ctld's warm row):
	// placement's room is Allocatable - Reserved - Warm. Heartbeats
	// renew it (HeartbeatWarm).
	Warm NodeAlloc
	// TTL is how long a heartbeat keeps the node alive.
	TTL time.Duration
	// Channel is the host:port of the node process's stream channel
	// (mTLS, nodechannel): how managers reach the node's sandboxes for
	// exec, files and logs. Empty: the node offers none.
	Channel string
}

// maxNodeList bounds the lists of a registration (root modes, templates).
const maxNodeList = 256

func (r Registration) validate() error {
	if err := names.CheckID("node id", r.NodeID); err != nil {
		return err
	}
	switch {
	case len(r.PublicKey) != ed25519.PublicKeySize:
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "register node %s: the key is %d bytes, want an ed25519 public key (%d)", r.NodeID, len(r.PublicKey), ed25519.PublicKeySize)
	case r.Allocatable.negative() || r.Warm.negative():
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "register node %s: negative capacity %+v (warm %+v)", r.NodeID, r.Allocatable, r.Warm)
	case r.TTL <= 0:
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "register node %s: the heartbeat TTL must be positive", r.NodeID)
	case len(r.RootModes) > maxNodeList || len(r.Templates) > maxNodeList:
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "register node %s: more than %d root modes or templates", r.NodeID, maxNodeList)
	case len(r.Name) > 253 || len(r.RunscVersion) > 256 || len(r.Platform) > 64 || len(r.Channel) > 260:
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "register node %s: name, runsc version, platform or channel too long", r.NodeID)
	}
	if r.Channel != "" {
		if _, port, err := net.SplitHostPort(r.Channel); err != nil || port == "" {
			return errdefs.Errorf(errdefs.CodeInvalidArgument, "register node %s: channel %q is not host:port", r.NodeID, r.Channel)
		}
	}
	for _, m := range r.RootModes {
		if m != string(api.RootFSOverlay) && m != string(api.RootFSBlock) {
			return errdefs.Errorf(errdefs.CodeInvalidArgument, "register node %s: unknown root mode %q", r.NodeID, m)
		}
	}
	for _, t := range r.Templates {
		if err := names.CheckID("template", t); err != nil {
			return err
		}
	}
	return nil
}

// FleetNode is a registered node as the database has it.
type FleetNode struct {
	NodeID      string    `json:"node_id"`
	Name        string    `json:"name"`
	State       string    `json:"state"`
	Reason      string    `json:"reason,omitempty"`
	PublicKey   []byte    `json:"public_key"`
	Allocatable NodeAlloc `json:"allocatable"`
	Reserved    NodeAlloc `json:"reserved"`
	// Warm is what the node's warm pool held at its last heartbeat.
	Warm         NodeAlloc `json:"warm"`
	RunscVersion string    `json:"runsc_version"`
	Platform     string    `json:"platform"`
	RootModes    []string  `json:"root_modes"`
	Templates    []string  `json:"templates"`
	HeartbeatAt  time.Time `json:"heartbeat_at"`
	TTL          Duration  `json:"ttl"`
	Channel      string    `json:"channel,omitempty"`
}

// Duration is a time.Duration that prints as text in JSON ("30s").
type Duration time.Duration

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("parse duration %q: %w", b, err)
	}
	*d = Duration(v)
	return nil
}

// Expires is when the node's last heartbeat stops keeping it alive.
func (n FleetNode) Expires() time.Time { return n.HeartbeatAt.Add(time.Duration(n.TTL)) }

// fleetSelect reads registered nodes.
const fleetSelect = `SELECT n.node_id, n.name, n.state, n.state_reason, n.public_key,
	n.alloc_cpu_millis, n.alloc_memory_bytes, n.alloc_disk_bytes, n.alloc_sandboxes,
	n.reserved_cpu_millis, n.reserved_memory_bytes, n.reserved_disk_bytes, n.reserved_sandboxes,
	n.warm_cpu_millis, n.warm_memory_bytes, n.warm_disk_bytes, n.warm_sandboxes,
	n.runsc_version, n.platform, n.root_modes, n.templates, n.heartbeat_at, n.ttl_ms, n.channel
	FROM nodes n WHERE n.state <> ''`

func scanFleetNode(row rowScanner) (FleetNode, error) {
	var n FleetNode
	var modes, templates, hb string
	var ttl int64
	if err := row.Scan(&n.NodeID, &n.Name, &n.State, &n.Reason, &n.PublicKey,
		&n.Allocatable.CPUMillis, &n.Allocatable.MemoryBytes, &n.Allocatable.DiskBytes, &n.Allocatable.Sandboxes,
		&n.Reserved.CPUMillis, &n.Reserved.MemoryBytes, &n.Reserved.DiskBytes, &n.Reserved.Sandboxes,
		&n.Warm.CPUMillis, &n.Warm.MemoryBytes, &n.Warm.DiskBytes, &n.Warm.Sandboxes,
		&n.RunscVersion, &n.Platform, &modes, &templates, &hb, &ttl, &n.Channel); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return n, notFound("node not registered")
		}
		return n, fmt.Errorf("read node: %w", err)
	}
	if err := errors.Join(json.Unmarshal([]byte(modes), &n.RootModes), json.Unmarshal([]byte(templates), &n.Templates)); err != nil {
		return n, fmt.Errorf("decode node %s: %w", n.NodeID, err)
	}
	n.TTL = Duration(time.Duration(ttl) * time.Millisecond)
	var err error
	n.HeartbeatAt, err = parseTS(hb)
	return n, err
}

func fleetNodeTx(ctx context.Context, q querier, nodeID string) (FleetNode, error) {
	n, err := scanFleetNode(q.QueryRowContext(ctx, fleetSelect+` AND n.node_id = ?`, nodeID))
	if errdefs.CodeOf(err) == errdefs.CodeNotFound {
		return n, notFound("node %s is not registered", nodeID)
	}
	return n, err
}

// FleetNode returns a registered node.
func (s *Store) FleetNode(ctx context.Context, nodeID string) (FleetNode, error) {
	return fleetNodeTx(ctx, s.db, nodeID)
}

// FleetNodes returns the registered nodes, ordered by id.
func (s *Store) FleetNodes(ctx context.Context) ([]FleetNode, error) {
	out, err := collect(ctx, s.db, scanFleetNode, fleetSelect+` ORDER BY n.node_id`)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	return out, nil
}

// RegisterNode records a node's registration and counts as a heartbeat.
// The first registration pins the key (as does a direct contact before
// it); a registration with another key is refused (fenced) and changes
// nothing: only a signed rotation moves a pinned key. A new or lost node
// becomes ready; a cordoned or draining one stays so.
func (s *Store) RegisterNode(ctx context.Context, r Registration) (FleetNode, error) {
	if err := r.validate(); err != nil {
		return FleetNode{}, err
	}
	modes, _ := json.Marshal(orEmpty(r.RootModes))
	templates, _ := json.Marshal(orEmpty(r.Templates))
	var out FleetNode
	err := s.tx(ctx, func(tx *sql.Tx) error {
		now := ts(s.now())
		var pinned []byte
		var state string
		err := tx.QueryRowContext(ctx, `SELECT public_key, state FROM nodes WHERE node_id = ?`, r.NodeID).Scan(&pinned, &state)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			if _, err := tx.ExecContext(ctx, `INSERT INTO nodes (node_id, public_key, socket, first_seen, last_seen) VALUES (?, ?, '', ?, ?)`,
				r.NodeID, r.PublicKey, now, now); err != nil {
				return fmt.Errorf("record node %s: %w", r.NodeID, err)
			}
		case err != nil:
			return fmt.Errorf("read node %s: %w", r.NodeID, err)
		case len(pinned) > 0 && !bytes.Equal(pinned, r.PublicKey):
			return errdefs.Errorf(errdefs.CodeFenced, "register node %s: it presents key %x, but %x is pinned; only a rotation the pinned key signed moves it", r.NodeID, r.PublicKey, pinned)
		}
		next := NodeReady
		if state == NodeCordoned || state == NodeDraining {
			next = state
		}
		if _, err := tx.ExecContext(ctx, `UPDATE nodes SET public_key = ?, name = ?, state = ?, state_reason = '', last_seen = ?,
			alloc_cpu_millis = ?, alloc_memory_bytes = ?, alloc_disk_bytes = ?, alloc_sandboxes = ?,
			warm_cpu_millis = ?, warm_memory_bytes = ?, warm_disk_bytes = ?, warm_sandboxes = ?,
			runsc_version = ?, platform = ?, root_modes = ?, templates = ?, heartbeat_at = ?, ttl_ms = ?, channel = ?
			WHERE node_id = ?`,
			r.PublicKey, r.Name, next, now,
			r.Allocatable.CPUMillis, r.Allocatable.MemoryBytes, r.Allocatable.DiskBytes, r.Allocatable.Sandboxes,
			r.Warm.CPUMillis, r.Warm.MemoryBytes, r.Warm.DiskBytes, r.Warm.Sandboxes,
			r.RunscVersion, r.Platform, string(modes), string(templates), now, r.TTL.Milliseconds(), r.Channel, r.NodeID); err != nil {
			return fmt.Errorf("register node %s: %w", r.NodeID, err)
		}
		out, err = fleetNodeTx(ctx, tx, r.NodeID)
		return err
	})
	return out, err
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// Heartbeat renews a registered node's TTL. A lost node is fenced: it
// must register again (and its ctld release what the database no longer
// gives it) before it takes work.
func (s *Store) Heartbeat(ctx context.Context, nodeID string) (FleetNode, error) {
	return s.heartbeat(ctx, nodeID, nil)
}

// HeartbeatWarm is Heartbeat that also records what the node's warm pool
// holds now (placement counts it; ctld's warm row).
func (s *Store) HeartbeatWarm(ctx context.Context, nodeID string, warm NodeAlloc) (FleetNode, error) {
	if warm.negative() {
		return FleetNode{}, errdefs.Errorf(errdefs.CodeInvalidArgument, "heartbeat of node %s: negative warm capacity %+v", nodeID, warm)
	}
	return s.heartbeat(ctx, nodeID, &warm)
}

func (s *Store) heartbeat(ctx context.Context, nodeID string, warm *NodeAlloc) (FleetNode, error) {
	var out FleetNode
	err := s.tx(ctx, func(tx *sql.Tx) error {
		n, err := fleetNodeTx(ctx, tx, nodeID)
		if err != nil {
			return err
		}
		if n.State == NodeLost {
			return errdefs.Errorf(errdefs.CodeFenced, "heartbeat of node %s: the node was marked lost (%s); register again", nodeID, n.Reason)
		}
		now := ts(s.now())
		if _, err := tx.ExecContext(ctx, `UPDATE nodes SET heartbeat_at = ?, last_seen = ? WHERE node_id = ?`, now, now, nodeID); err != nil {
			return fmt.Errorf("heartbeat of node %s: %w", nodeID, err)
		}
		if warm != nil {
			if _, err := tx.ExecContext(ctx, `UPDATE nodes SET warm_cpu_millis = ?, warm_memory_bytes = ?, warm_disk_bytes = ?, warm_sandboxes = ? WHERE node_id = ?`,
				warm.CPUMillis, warm.MemoryBytes, warm.DiskBytes, warm.Sandboxes, nodeID); err != nil {
				return fmt.Errorf("heartbeat of node %s: record its warm pool: %w", nodeID, err)
			}
		}
		out, err = fleetNodeTx(ctx, tx, nodeID)
		return err
	})
	return out, err
}

// SetNodeState moves a registered node between ready, cordoned and
// draining (the operator's cordon, uncordon and drain): a cordoned or
// draining node takes no new placements. A lost node is a conflict: it
// comes back only by registering again.
func (s *Store) SetNodeState(ctx context.Context, nodeID, state string) (FleetNode, error) {
	if state != NodeReady && state != NodeCordoned && state != NodeDraining {
		return FleetNode{}, errdefs.Errorf(errdefs.CodeInvalidArgument, "node state %q cannot be set (ready, cordoned or draining)", state)
	}
	var out FleetNode
	err := s.tx(ctx, func(tx *sql.Tx) error {
		n, err := fleetNodeTx(ctx, tx, nodeID)
		if err != nil {
			return err
		}
		if n.State == NodeLost {
			return errdefs.Errorf(errdefs.CodeConflict, "node %s is lost (%s); it comes back by registering again", nodeID, n.Reason)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE nodes SET state = ?, state_reason = '' WHERE node_id = ?`, state, nodeID); err != nil {
			return fmt.Errorf("set state of node %s: %w", nodeID, err)
		}
		out, err = fleetNodeTx(ctx, tx, nodeID)
		return err
	})
	return out, err
}

// LostNode is what MarkLostNodes did to one node.
type LostNode struct {
	NodeID string `json:"node_id"`
	Reason string `json:"reason"`
	// Failed are its overlay sandboxes, now failed; Lost its block
	// sandboxes, now lost (their committed head outlives the node; resuming
	// them elsewhere is not done here).
	Failed []string `json:"failed,omitempty"`
	Lost   []string `json:"lost,omitempty"`
}

// MarkLostNodes marks lost every registered node whose last heartbeat is
// older than its TTL plus grace, and in the same transaction fails its
// live overlay sandboxes (and their pending operations) with the reason
// and marks its block sandboxes lost. The reservations stay: the capacity
// is the lost node's until its cleanup proofs come back. Idempotent: a
// node already lost is not touched again.
func (s *Store) MarkLostNodes(ctx context.Context, grace time.Duration) ([]LostNode, error) {
	var out []LostNode
	err := s.tx(ctx, func(tx *sql.Tx) error {
		out = nil
		now := s.now()
		nodes, err := collect(ctx, tx, scanFleetNode, fleetSelect+` AND n.state <> 'lost' ORDER BY n.node_id`)
		if err != nil {
			return fmt.Errorf("list nodes: %w", err)
		}
		for _, n := range nodes {
			if !now.After(n.Expires().Add(grace)) {
				continue
			}
			ln := LostNode{NodeID: n.NodeID, Reason: fmt.Sprintf("node %s lost: no heartbeat since %s (TTL %s, grace %s)",
				n.NodeID, n.HeartbeatAt.UTC().Format(time.RFC3339), time.Duration(n.TTL), grace)}
			if err := loseNodeTx(ctx, tx, &ln, ts(now)); err != nil {
				return err
			}
			out = append(out, ln)
		}
		return nil
	})
	return out, err
}

func loseNodeTx(ctx context.Context, tx *sql.Tx, ln *LostNode, now string) error {
	if _, err := tx.ExecContext(ctx, `UPDATE nodes SET state = 'lost', state_reason = ? WHERE node_id = ?`, ln.Reason, ln.NodeID); err != nil {
		return fmt.Errorf("mark node %s lost: %w", ln.NodeID, err)
	}
	type onNode struct {
		id   string
		gen  uint64
		mode string
	}
	rows, err := collect(ctx, tx, func(r rowScanner) (onNode, error) {
		var o onNode
		var rootfs string
		if err := r.Scan(&o.id, &o.gen, &rootfs); err != nil {
			return o, err
		}
		var rf api.RootFS
		if err := json.Unmarshal([]byte(rootfs), &rf); err != nil {
			return o, fmt.Errorf("decode rootfs of %s/%d: %w", o.id, o.gen, err)
		}
		o.mode = string(rf.Mode)
		return o, nil
	}, `SELECT s.id, s.generation, g.rootfs FROM sandboxes s JOIN generations g ON g.sandbox_id = s.id AND g.generation = s.generation
		WHERE s.node_id = ? AND s.state IN (?, ?, ?) ORDER BY s.id`,
		ln.NodeID, api.StateClaiming, api.StateReady, api.StateReleasing)
	if err != nil {
		return fmt.Errorf("list sandboxes of node %s: %w", ln.NodeID, err)
	}
	for _, o := range rows {
		state := api.StateFailed
		if o.mode == string(api.RootFSBlock) {
			state = api.StateLost
			ln.Lost = append(ln.Lost, o.id)
		} else {
			ln.Failed = append(ln.Failed, o.id)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE sandboxes SET state = ?, reason = ? WHERE id = ?`, state, ln.Reason, o.id); err != nil {
			return fmt.Errorf("update sandbox %s: %w", o.id, err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE generations SET state = ? WHERE sandbox_id = ? AND generation = ?`, state, o.id, o.gen); err != nil {
			return fmt.Errorf("update generation %s/%d: %w", o.id, o.gen, err)
		}
		if state == api.StateFailed {
			if _, err := tx.ExecContext(ctx, `UPDATE generations SET ended_at = ? WHERE sandbox_id = ? AND generation = ?`, now, o.id, o.gen); err != nil {
				return fmt.Errorf("end generation %s/%d: %w", o.id, o.gen, err)
			}
			if _, err := tx.ExecContext(ctx, `UPDATE operations SET state = 'failed', error = ?, finished_at = ? WHERE sandbox_id = ? AND state = 'pending'`,
				ln.Reason, now, o.id); err != nil {
				return fmt.Errorf("fail operations of %s: %w", o.id, err)
			}
		}
	}
	return nil
}

// SandboxReason is why a sandbox ended as it did ("" if nothing said so).
func (s *Store) SandboxReason(ctx context.Context, id string) (string, error) {
	var r string
	err := s.db.QueryRowContext(ctx, `SELECT reason FROM sandboxes WHERE id = ?`, id).Scan(&r)
	if errors.Is(err, sql.ErrNoRows) {
		return "", notFound("sandbox %s not known to the manager", id)
	}
	if err != nil {
		return "", fmt.Errorf("read reason of %s: %w", id, err)
	}
	return r, nil
}

func holds(list []string, s string) bool { return slices.Contains(list, s) }

// Abandoned returns the sandboxes placed on node nodeID that the database
// failed (as when the node was marked lost) while their generation still
// holds a reservation there: what the node's ctld must release, with a
// recorded operation and a proof, before the capacity comes back. Lost
// block sandboxes are not among them: their fate (resumed elsewhere, or
// kept) is not decided here.
func (s *Store) Abandoned(ctx context.Context, nodeID string) ([]SandboxRecord, error) {
	out, err := collect(ctx, s.db, scanSandbox, `SELECT s.id, s.created_at, s.state, s.generation, COALESCE(s.node_id, '') FROM sandboxes s
		JOIN reservations r ON r.sandbox_id = s.id AND r.generation = s.generation AND r.node_id = s.node_id
		WHERE s.node_id = ? AND s.state = ? AND r.released_at IS NULL ORDER BY s.id LIMIT ?`,
		nodeID, api.StateFailed, maxNodeWork)
	if err != nil {
		return nil, fmt.Errorf("list the abandoned sandboxes of node %s: %w", nodeID, err)
	}
	return out, nil
}
