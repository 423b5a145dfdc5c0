package node

import "github.com/ctld/ctld/internal/node/writers"

// The kernel subsystems the node drives live in their concern packages
// (guest, overlay, network, writers), as the node uses them: exactly the
// methods it calls, so a fake kernel (node/fakekernel) can stand in for
// them in unit tests; their doc comments define the semantics (idempotent
// removal, CheckGone, List by ctld name) a fake must keep.

// Block mode (rootfs.mode = block, DESIGN.md "RootFS"): the block
// subsystems are internal/node/writers' (its doc comments define them);
// these names stay for the node's wiring and rigs.
type (
	BlockDevices   = writers.Devices
	BlockMounts    = writers.Mounts
	BlockTemplates = writers.Templates
	BlockVolumes   = writers.Volumes
	BlockSealer    = writers.Sealer
	BlockFreezer   = writers.Freezer
)
