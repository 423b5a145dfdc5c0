package node

import (
	"context"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
)

// expiryOp is the operation id of the release a max lifetime triggers; being
// derived from the container, a release re-armed by a new primary after a
// failover is the same operation, never a second one.
func expiryOp(cid string) string { return "expire-" + cid }

// armExpiry schedules the release of a ready generation at CreatedAt +
// max_lifetime_sec. Timers live in the primary's memory only: Reconcile
// re-arms them on takeover from the journaled request.
func (n *Node) armExpiry(s journal.Sandbox) {
	if s.Request == nil || s.Request.MaxLifetimeSec <= 0 {
		return
	}
	deadline := s.CreatedAt.Add(time.Duration(s.Request.MaxLifetimeSec) * time.Second)
	id, gen, cid := s.ID, s.Generation, s.ContainerID
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return
	}
	if t, ok := n.timers[cid]; ok {
		t.Stop()
	}
	n.timers[cid] = time.AfterFunc(time.Until(deadline), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		_, err := n.Release(ctx, id, ReleaseRequest{OperationID: expiryOp(cid), Generation: gen})
		switch errdefs.CodeOf(err) {
		case "":
			n.log.Info("released at max lifetime", "sandbox", id, "generation", gen)
		case errdefs.CodeConflict, errdefs.CodeFenced, errdefs.CodeNotFound:
			// Released or replaced before its deadline.
		case errdefs.CodeNotPrimary, errdefs.CodeUnavailable:
			n.log.Info("release at max lifetime left to the next primary", "sandbox", id, "generation", gen, "err", err)
		default:
			n.log.Error("release at max lifetime failed", "sandbox", id, "generation", gen, "err", err)
		}
		n.mu.Lock()
		delete(n.timers, cid)
		n.mu.Unlock()
	})
}

// Close stops the node's timers; the next primary re-arms them.
func (n *Node) Close() {
	n.stopExitWatch()
	n.mu.Lock()
	defer n.mu.Unlock()
	n.closed = true
	for cid, t := range n.timers {
		t.Stop()
		delete(n.timers, cid)
	}
}
