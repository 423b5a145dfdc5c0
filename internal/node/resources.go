package node

import (
	"github.com/ctld/ctld/internal/node/blockroot"
	"github.com/ctld/ctld/internal/node/guest"
	"github.com/ctld/ctld/internal/node/network"
	"github.com/ctld/ctld/internal/node/overlay"
	"github.com/ctld/ctld/internal/node/pvolume"
	"github.com/ctld/ctld/internal/node/resource"
)

// A generation owns one object of each resource kind in the table below.
// Every part of the node walks the same table, so a new kind is one entry:
//   - a claim makes the entries in order, each journaled by effect()
//     (intended, made, done) before and after the kernel call;
//   - a teardown removes them in reverse order, each journaled as removing
//     first; an entry the journal never saw intended is not removed but
//     its proof check still runs (and, should the object exist after all,
//     removes it as a second line of defence, which is reported);
//   - the cleanup proof has one check per entry;
//   - reconcile asks each entry whether a ready generation's object is
//     missing, finishes effect records no live generation owns, and sweeps
//     the kernel for objects under ctld's names that no generation owns.
type entry = resource.Entry[*resource.Claim]

// newTable is the resource table: claim order is by phase
// (resource.Phase), then by the order of registration here.
func newTable(n *Node) *resource.Table[*resource.Claim] {
	var b resource.Builder[*resource.Claim]
	register(&b, n)
	return b.Table()
}

// register adds the node's entries to b, one line per concern; each
// concern decides once which of its subsystems this node has and adds the
// entries of the others absent (resource.Builder.Add). Within a phase,
// claim order is the order here: the log dir before the lease (the log
// writer of runsc create needs it) before the agent dir, the bundle and
// runsc (last: the guest); the disk quota before the overlay mount (the
// quota bounds the scratch dir before the upper is used); the writer
// before the block mount; persistent volumes after the root (the bundle
// binds them); the netns before the links (which need its path), the
// conntrack flush after the nft objects that mark flows are gone, the
// policy before the DNS entry (which adds answers to its sets).
func register(b *resource.Builder[*resource.Claim], n *Node) {
	guest.Register(b, n.guest)
	overlay.Register(b, n.overlay)
	blockroot.Register(b, n.blockRoot())
	pvolume.Register(b, n.pvolumes())
	network.Register(b, n.net)
}

// CrashPoints lists every crash point of a generation's life, in the order
// a claim and then its teardown and a takeover's orphan handling reach
// them (see Deps.Crash): derived from the table's declared specs.
func CrashPoints() []string { return newTable(&Node{}).CrashPoints(network.UpdateCrashPoints()) }
