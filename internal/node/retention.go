package node

import (
	"context"
	"time"

	"github.com/ctld/ctld/internal/journal"
)

// pruneBatch bounds one pruning transaction: claims wait for the journal's
// write lock at most this many record deletions.
const pruneBatch = 256

// KeepHistory prunes the journal's history to r every interval until ctx
// ends (run it beside the API). A backlog (a long outage, a lowered
// setting) goes in batches with a pause between them so claims and
// releases interleave.
func (n *Node) KeepHistory(ctx context.Context, r journal.Retention, every time.Duration) {
	if r.MaxAge <= 0 && r.MaxRecords <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		n.pruneHistory(ctx, r)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (n *Node) pruneHistory(ctx context.Context, r journal.Retention) {
	var pruned, early int
	for ctx.Err() == nil {
		res, err := n.d.Journal.Prune(r, time.Now(), pruneBatch)
		if err != nil {
			n.log.Error("prune journal history", "err", err)
			return
		}
		pruned, early = pruned+res.Pruned, early+res.Early
		if !res.More {
			if pruned > 0 {
				n.log.Info("pruned journal history", "records", pruned, "remaining", res.Remaining)
			}
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
	if early > 0 {
		n.log.Warn("journal record limit pruned history younger than the retention age: those operation ids are no longer idempotent",
			"records", early, "max_age", r.MaxAge, "max_records", r.MaxRecords)
	}
}
