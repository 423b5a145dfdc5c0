package node

import (
	"context"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
)

// UpdateNetwork replaces the network policy of the sandbox's running
// generation (a live update, docs/network-design.md §6). p is validated by
// the API server.
//
// Not built yet: until the firewall and the flows are wired into the node
// it refuses every update of an existing sandbox with conflict (the fixed
// set of codes has no failed_precondition; the sandbox cannot take the
// request in the node's present state), and changes nothing.
func (n *Node) UpdateNetwork(ctx context.Context, id string, p api.NetworkPolicy) (api.Sandbox, error) {
	if _, err := n.sandbox(id); err != nil {
		return api.Sandbox{}, err
	}
	return api.Sandbox{}, errdefs.Errorf(errdefs.CodeConflict, "sandbox %s: live network update is not built yet", id)
}
