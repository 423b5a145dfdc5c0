package network

import (
	"context"

	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/netpolicy"
)

// Counters reads the counters of generation s's nft chain in any state
// its chain may still exist in (metering reads them once more as a
// teardown begins, before the chain is removed); ok is false when s has
// no sandbox network or the chain cannot be read.
func (n *Net) Counters(ctx context.Context, s journal.Sandbox) (netpolicy.Counters, bool) {
	if n.d.Firewall == nil {
		return netpolicy.Counters{}, false
	}
	o, ok, err := n.owner(s)
	if err != nil || !ok {
		return netpolicy.Counters{}, false
	}
	c, err := n.d.Firewall.Counters(ctx, o)
	return c, err == nil
}
