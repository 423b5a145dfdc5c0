package nodeagent

import (
	"context"
	"errors"
	"fmt"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
)

// reconcile asks ctld about what the database failed or lost on this
// node while ctld may still run it: at registration and at every
// heartbeat after, since a claim in flight during the registration ends
// on ctld later (test/model: a registration-only pass left such a
// generation running for good). Failed generations ctld runs are released
// (releaseAbandoned); lost block generations it runs are the sandbox's
// again (readoptLost).
func (a *Agent) reconcile(ctx context.Context, nodeID string) error {
	return errors.Join(a.releaseAbandoned(ctx, nodeID), a.readoptLost(ctx, nodeID))
}

// readoptLost gives back each lost sandbox of this node whose generation
// ctld still runs (ready): the node came back before the sandbox was
// taken over elsewhere. One ctld does not run stays lost.
func (a *Agent) readoptLost(ctx context.Context, nodeID string) error {
	recs, err := a.Store.LostOn(ctx, nodeID)
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range recs {
		sb, err := a.Client.Get(ctx, r.ID)
		if err != nil || sb.Generation != r.Generation || sb.State != api.StateReady {
			continue // not running here (or not yet: a claim in flight); asked again at the next heartbeat
		}
		err = a.Store.ReadoptLost(ctx, nodeID, r.ID, r.Generation)
		if errdefs.CodeOf(err) == errdefs.CodeFenced {
			continue // taken over or lost again meanwhile
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("readopt lost %s: %w", r.ID, err))
			continue
		}
		a.log().Info("lost sandbox still runs here; readopted", "node", nodeID, "sandbox", r.ID, "generation", r.Generation)
	}
	return errors.Join(errs...)
}
