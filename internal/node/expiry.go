package node

import (
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
		n.releaseInBackground(id, gen, expiryOp(cid), "at max lifetime")
		n.mu.Lock()
		delete(n.timers, cid)
		n.mu.Unlock()
	})
}

// releaseInBackground releases generation gen of sandbox id under
// operation opID on behalf of the node itself (a max lifetime, an on_exit
// release), bounded by the term; why names the trigger in the log. A
// generation released or replaced first is no error; one the term's end
// interrupted is the next primary's (it re-arms the trigger).
func (n *Node) releaseInBackground(id string, gen uint64, opID, why string) {
	ctx, cancel := n.background(5 * time.Minute)
	defer cancel()
	_, err := n.Release(ctx, id, ReleaseRequest{OperationID: opID, Generation: gen})
	log := n.log.With("sandbox", id, "generation", gen, "operation", opID)
	switch errdefs.CodeOf(err) {
	case "":
		log.Info("released " + why)
	case errdefs.CodeConflict, errdefs.CodeFenced, errdefs.CodeNotFound:
		// Released or replaced first.
	case errdefs.CodeNotPrimary, errdefs.CodeUnavailable:
		log.Info("release "+why+" left to the next primary", "err", err)
	default:
		log.Error("release "+why+" failed", "err", err)
	}
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
