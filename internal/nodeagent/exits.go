package nodeagent

import (
	"context"
	"fmt"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/manager"
)

// Exits and usage in fleet mode: the replicas drive no ctld, so this
// process tells the database what its ctld saw. A guest's exit (ctld
// journals the generation exited, with kind and code) is recorded on the
// generation the node holds (Store.RecordPlacedExit); the replicas' exit
// watch then records the owner's exit, sends the one exited event and,
// for on_exit destroy, destroys the sandbox through this node (a placed
// release, its proof judged against the node's pinned key). The metering
// stream (ctld's GET /v1/usage) is paged into usage_records with the
// node's cursor (manager.UsagePuller), which the replicas' idle timers
// read for egress.

// exitWatch remembers the exits recorded (or refused for good) so each is
// written once per process; a restarted process writes each again, which
// the store takes as a repeat.
type exitWatch struct {
	seen map[string]uint64 // sandbox id -> exited generation recorded
}

// scan asks ctld for its sandboxes once and records each exit not
// recorded yet. ctld's answer bounds the work: one database transaction
// per new exit.
func (a *Agent) scanExits(ctx context.Context, nodeID string, w *exitWatch) error {
	l, err := a.Client.List(ctx)
	if err != nil {
		return fmt.Errorf("list ctld's sandboxes: %w", err)
	}
	exited := make(map[string]uint64, len(w.seen))
	var errs []error
	for _, sb := range l.Sandboxes {
		if sb.State != api.StateExited || sb.Exit == nil {
			continue
		}
		exited[sb.ID] = sb.Generation
		if g, ok := w.seen[sb.ID]; ok && g == sb.Generation {
			continue
		}
		e := manager.SandboxExit{Kind: sb.Exit.Kind, Code: sb.Exit.Code, At: sb.Exit.At.UTC()}
		first, err := a.Store.RecordPlacedExit(ctx, nodeID, sb.ID, sb.Generation, e)
		switch errdefs.CodeOf(err) {
		case "":
		case errdefs.CodeFenced, errdefs.CodeNotFound:
			// Not this node's generation in the database (taken over, or a
			// sandbox of no fleet): its release is ReleaseStale's business.
			a.log().Debug("exit of a generation the database does not give this node", "sandbox", sb.ID, "generation", sb.Generation, "err", err)
		default:
			errs = append(errs, err)
			continue
		}
		w.seen[sb.ID] = sb.Generation
		if first {
			a.log().Info("sandbox exited", "sandbox", sb.ID, "generation", sb.Generation, "kind", e.Kind, "code", e.Code)
		}
	}
	// Forget what ctld no longer shows exited (released): the map stays
	// as small as ctld's list.
	for id, g := range w.seen {
		if exited[id] != g {
			delete(w.seen, id)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("record exits: %w", errs[0])
	}
	return nil
}

// watchExits scans every Poll until ctx ends.
func (a *Agent) watchExits(ctx context.Context, nodeID string) {
	w := &exitWatch{seen: map[string]uint64{}}
	t := time.NewTicker(a.poll())
	defer t.Stop()
	for {
		if err := a.scanExits(ctx, nodeID, w); err != nil && ctx.Err() == nil {
			a.log().Warn("exit watch", "node", nodeID, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// pullUsage pages ctld's metering stream into the database every
// UsagePull (0: never) until ctx ends. The cursor is committed with each
// page, so a restart of this process neither loses nor repeats a record.
func (a *Agent) pullUsage(ctx context.Context) {
	if a.UsagePull <= 0 {
		return
	}
	manager.UsagePuller{Store: a.Store, Source: a.Client, Log: a.log()}.Run(ctx, a.UsagePull)
}
