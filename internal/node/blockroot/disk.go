package blockroot

import (
	"github.com/ctld/ctld/internal/cowdev"
	"github.com/ctld/ctld/internal/journal"
)

// DiskUsed is the disk block generation s takes on the node, for its
// usage (disk_used_bytes): the allocated bytes of its writer's dirty
// file (cowdev.DirtyBytes), i.e. what the guest wrote in this
// generation in whole chunks, not the template's or an earlier
// generation's data (in the block store), nor the chunk cache. ok is
// false before its writer is journaled or once its dir is gone.
func (n *Root) DiskUsed(s journal.Sandbox) (uint64, bool) {
	if s.Block == nil {
		return 0, false
	}
	b, err := cowdev.DirtyBytes(n.writerDir(s))
	return b, err == nil
}
