package manager

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
)

// Draining a node (issue 24: `ctl-manager node drain`): the node is
// marked draining (placement passes it over, so new claims go elsewhere),
// each of its ready block-mode sandboxes is paused through its node
// process (the root sealed as the sandbox's head, the release proven; a
// resume places it on another node from that head), and the overlay
// sandboxes, which cannot move, are waited for until they end or the
// wait runs out. Progress is reported after each step.

// PlacedSandbox is a live generation placed on a node.
type PlacedSandbox struct {
	ID         string           `json:"id"`
	Generation uint64           `json:"generation"`
	State      api.SandboxState `json:"state"`
	Mode       api.RootFSMode   `json:"mode"`
}

// NodeSandboxes lists the sandboxes whose generation on node nodeID is
// live (claiming, ready, exited, releasing, lost), in id order.
func (s *Store) NodeSandboxes(ctx context.Context, nodeID string) ([]PlacedSandbox, error) {
	return collect(ctx, s.db, func(r rowScanner) (PlacedSandbox, error) {
		var p PlacedSandbox
		var rootfs string
		if err := r.Scan(&p.ID, &p.Generation, &p.State, &rootfs); err != nil {
			return p, err
		}
		var fs api.RootFS
		if err := json.Unmarshal([]byte(rootfs), &fs); err != nil {
			return p, fmt.Errorf("decode root of %s: %w", p.ID, err)
		}
		p.Mode = fs.Mode
		return p, nil
	}, `SELECT s.id, s.generation, s.state, COALESCE(g.rootfs, '{}') FROM sandboxes s
		LEFT JOIN generations g ON g.sandbox_id = s.id AND g.generation = s.generation
		WHERE s.node_id = ? AND s.state IN (?, ?, ?, ?, ?) ORDER BY s.id`,
		nodeID, api.StateClaiming, api.StateReady, api.StateExited, api.StateReleasing, api.StateLost)
}

// MarkDrainPaused records, for a sandbox the service owns, that a drain
// paused it (as the service's own pause does), and journals its paused
// event with reason. owned is false for a sandbox no owner has.
func (s *Store) MarkDrainPaused(ctx context.Context, id, reason string) (owned bool, err error) {
	var owner string
	err = s.db.QueryRowContext(ctx, `SELECT owner FROM owned_sandboxes WHERE id = ? AND active = 1`, id).Scan(&owner)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("read owner of %s: %w", id, err)
	}
	if err := s.SetPaused(ctx, id, true); err != nil {
		return true, err
	}
	if _, err := s.AppendEvent(ctx, ServiceEvent{Owner: owner, SandboxID: id, Type: "paused", Reason: reason, Time: s.now()}); err != nil {
		return true, fmt.Errorf("journal the pause of %s: %w", id, err)
	}
	return true, nil
}

// DrainStatus is a drain's progress.
type DrainStatus struct {
	Node    string   `json:"node"`
	Paused  []string `json:"paused"`            // block sandboxes this drain paused
	Failed  []string `json:"failed,omitempty"`  // pauses that failed: "id: error"
	Left    []string `json:"left,omitempty"`    // live sandboxes still on the node
	Waiting bool     `json:"waiting,omitempty"` // more to wait for
}

// Drain marks node nodeID draining, pauses each of its ready block
// sandboxes one after another, then waits up to wait (polling every
// poll) for the rest to leave, calling progress after each step. It
// returns the last status: Left empty means the node holds nothing.
func (m *Manager) Drain(ctx context.Context, nodeID string, wait, poll time.Duration, progress func(DrainStatus)) (DrainStatus, error) {
	st := DrainStatus{Node: nodeID, Paused: []string{}}
	if progress == nil {
		progress = func(DrainStatus) {}
	}
	if m.Fleet == nil {
		return st, errdefs.Errorf(errdefs.CodeInvalidArgument, "drain %s: not a fleet manager", nodeID)
	}
	if _, err := m.Store.SetNodeState(ctx, nodeID, NodeDraining); err != nil {
		return st, fmt.Errorf("drain %s: %w", nodeID, err)
	}
	list, err := m.Store.NodeSandboxes(ctx, nodeID)
	if err != nil {
		return st, fmt.Errorf("drain %s: list its sandboxes: %w", nodeID, err)
	}
	for _, p := range list {
		if p.Mode != api.RootFSBlock || p.State != api.StateReady {
			continue
		}
		res, err := m.Pause(ctx, p.ID)
		if err == nil && !res.Verdict.OK() {
			err = fmt.Errorf("paused, but its cleanup is unproven: %s", res.Verdict.Reason)
		}
		if err == nil {
			_, err = m.Store.MarkDrainPaused(context.WithoutCancel(ctx), p.ID, "drain of node "+nodeID)
		}
		if err != nil {
			st.Failed = append(st.Failed, p.ID+": "+err.Error())
		} else {
			st.Paused = append(st.Paused, p.ID)
		}
		if ctx.Err() != nil {
			return st, ctx.Err()
		}
		if st.Left, err = m.left(ctx, nodeID); err != nil {
			return st, err
		}
		st.Waiting = true
		progress(st)
	}
	deadline := time.Now().Add(wait)
	for {
		if st.Left, err = m.left(ctx, nodeID); err != nil {
			return st, err
		}
		st.Waiting = len(st.Left) > 0 && time.Now().Before(deadline)
		progress(st)
		if !st.Waiting {
			return st, nil
		}
		select {
		case <-ctx.Done():
			return st, ctx.Err()
		case <-time.After(poll):
		}
	}
}

func (m *Manager) left(ctx context.Context, nodeID string) ([]string, error) {
	list, err := m.Store.NodeSandboxes(ctx, nodeID)
	if err != nil {
		return nil, fmt.Errorf("drain %s: list its sandboxes: %w", nodeID, err)
	}
	out := []string{}
	for _, p := range list {
		out = append(out, fmt.Sprintf("%s (%s, %s)", p.ID, p.Mode, p.State))
	}
	return out, nil
}
