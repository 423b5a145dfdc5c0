package node

import (
	"context"

	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/writers"
)

// diskUsed is the disk generation s holds on the node, for its usage: an
// overlay root's project quota usage of its scratch dir, a block root's
// dirty file's allocated bytes (blockroot.Root.DiskUsed). ok false: not
// known (no quota project, no writer yet, or its subsystem absent).
func (n *Node) diskUsed(ctx context.Context, s journal.Sandbox) (uint64, bool) {
	if writers.RootFSMode(s) == journal.RootFSBlock {
		if n.d.Writers.Devices == nil {
			return 0, false
		}
		return n.blockRoot().DiskUsed(s)
	}
	if n.d.Overlay.RootFS == nil || s.DiskProject == 0 {
		return 0, false
	}
	qs, err := n.d.Overlay.RootFS.DiskProjects(ctx, s.DiskProject, s.DiskProject)
	if err != nil || len(qs) != 1 {
		return 0, false
	}
	return qs[0].UsedBytes, true
}
