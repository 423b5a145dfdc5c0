package node

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/blockroot"
	"github.com/ctld/ctld/internal/node/pvolume"
	"github.com/ctld/ctld/internal/node/writers"
	"github.com/ctld/ctld/internal/proof"
)

// The node's wiring of block roots and persistent volumes: the writers'
// watch (internal/node/writers) over the records of both, and what of it
// the node still does itself (a lost generation's teardown).

// BlockConfig configures block-mode generations (writers.Config).
type BlockConfig = writers.Config

// VolumeInfo is a sandbox volume's head, snapshots and committed
// generations (blockroot.VolumeInfo).
type VolumeInfo = blockroot.VolumeInfo

// ForkRequest makes a sandbox a new identity over Source's committed
// generation: its snapshot Snapshot, or its head without one.
type ForkRequest = blockroot.ForkRequest

// rootfsMode is rec's RootFS mode (records from before modes: overlay).
func rootfsMode(rec journal.Sandbox) journal.RootFSMode { return writers.RootFSMode(rec) }

// tableFor is the resource table of rec's generation: every entry but
// those of the other RootFS mode.
func (n *Node) tableFor(rec journal.Sandbox) []entry { return n.table.For(rec) }

// claimTable is the entries rec's claim makes: tableFor(rec) but those
// it does not need (resource.Needer).
func (n *Node) claimTable(rec journal.Sandbox) []entry { return n.table.Claim(rec) }

// Pause seals the running block generation, publishes it as the
// sandbox's head and releases the generation; it returns the answer
// stored with the cleanup proof (Answers.Paused).
func (n *Node) Pause(ctx context.Context, id string, req PauseRequest) (json.RawMessage, error) {
	return n.blockRoot().Pause(ctx, id, blockroot.PauseRequest{OperationID: req.OperationID, Generation: req.Generation, RequestHash: requestHash("pause", id, req)})
}

// Snapshot seals the running generation under name while the guest
// runs, and returns the named snapshot and what the seal did.
func (n *Node) Snapshot(ctx context.Context, id, name string) (blockstore.Snapshot, journal.SealResult, error) {
	return n.blockRoot().Snapshot(ctx, id, name)
}

// Volume is sandbox id's volume (not_found: it has none).
func (n *Node) Volume(ctx context.Context, id string) (VolumeInfo, error) {
	return n.blockRoot().Volume(ctx, id)
}

// Fork makes id's volume a generation 0 over the source's committed
// generation, published as id's first head.
func (n *Node) Fork(ctx context.Context, id string, req ForkRequest) (VolumeInfo, error) {
	return n.blockRoot().Fork(ctx, id, req)
}

// Restore moves id's head to its snapshot (compare-and-swap over the head
// read here).
func (n *Node) Restore(ctx context.Context, id, snapshot string) (VolumeInfo, error) {
	return n.blockRoot().Restore(ctx, id, snapshot)
}

// Defaults of the writers' watch (writers.DefaultCheck, DefaultRestarts).
const (
	DefaultWriterCheck    = writers.DefaultCheck
	DefaultWriterRestarts = writers.DefaultRestarts
)

// WatchWriters checks the writers of every ready generation every
// CheckEvery, and restarts the dead ones, until ctx (the term) ends or
// the node closes (writers.Watch.Run).
func (n *Node) WatchWriters(ctx context.Context) { n.writers().Run(ctx) }

// writers is the watch over this node's writers.
func (n *Node) writers() *writers.Watch {
	return &writers.Watch{
		Config: n.cfg.Block, Devices: n.d.Writers.Devices, Journal: n.d.Journal, Term: n.term, Locks: &n.locks,
		Crash: n.crash, Stopped: n.isClosed, Log: n.log,
		Root: n.blockRoot().Writers(), Volumes: pvolume.Writers{Journal: n.d.Journal}, Loser: writers.LoserFunc(n.loseWriter),
	}
}

// blockRoot is this node's block roots.
func (n *Node) blockRoot() *blockroot.Root {
	return blockroot.New(blockroot.Wiring{
		Deps: n.d.Block, Shared: n.writersShared(), Epoch: n.d.Epoch, Ops: n.ops, Locks: &n.locks, Teardown: pauseTeardown{n},
	})
}

// writersShared is what block roots and persistent volumes share.
func (n *Node) writersShared() writers.Shared {
	return writers.Shared{
		Writers: n.d.Writers, Config: n.cfg.Block, Journal: n.d.Journal, NodeID: n.d.Identity.NodeID,
		Term: n.term, Crash: n.crash, Log: n.log,
	}
}

// pauseTeardown is a pause's release: the node's teardown, then the
// carriers' pool is refilled.
type pauseTeardown struct{ n *Node }

func (t pauseTeardown) Teardown(ctx context.Context, rec journal.Sandbox, opID string, final journal.State, reason string) (proof.Proof, error) {
	p, err := t.n.teardown(ctx, rec, opID, final, reason)
	t.n.kickCarriers()
	return p, err
}

// pvolumes is this node's persistent volumes (the volumes entry).
func (n *Node) pvolumes() *pvolume.Volumes {
	return pvolume.New(pvolume.Wiring{Deps: n.d.Volumes, Shared: n.writersShared(), Watch: n.writers()})
}

// loseWriter ends a ready generation whose writer could not be restarted
// as lost: torn down with a cleanup proof, as a takeover does with one
// whose kernel objects are gone.
func (n *Node) loseWriter(ctx context.Context, s journal.Sandbox, cause error) {
	reason := fmt.Sprintf("lost: %v", cause)
	n.log.Error("generation lost: its writer could not be restarted", "sandbox", s.ID, "generation", s.Generation, "err", cause)
	n.setState(s.ID, journal.StateLost, reason)
	if cur, err := n.sandbox(s.ID); err == nil && cur.Generation == s.Generation {
		s = cur
	}
	if _, err := n.teardown(ctx, s, "lost-"+s.ContainerID, journal.StateReleased, reason); err != nil {
		n.log.Warn("teardown of the lost generation", "sandbox", s.ID, "generation", s.Generation, "err", err)
	}
}

// The node's calls into block roots, volumes and the writers' watch
// (one-line delegations, so claim, identify and reconcile read as before).

// checkBlock refuses a block claim this node cannot serve before anything
// is journaled, and fills in its disk lease (blockroot.Root.Check).
func (n *Node) checkBlock(ctx context.Context, id string, req *journal.ClaimRequest) error {
	return n.blockRoot().Check(ctx, id, req)
}

// identifyBlock fills in the device of a writer whose start the journal
// saw intended but not done (blockroot.Root.Identify).
func (n *Node) identifyBlock(ctx context.Context, rec journal.Sandbox) (journal.Sandbox, bool) {
	return n.blockRoot().Identify(ctx, rec)
}

// settleSeal resolves, on takeover, a pause that was sealing when the
// last primary stopped (blockroot.Root.Settle).
func (n *Node) settleSeal(ctx context.Context, s journal.Sandbox) (journal.Sandbox, bool) {
	return n.blockRoot().Settle(ctx, s)
}

// checkVolumes refuses a claim naming volumes this node cannot attach or
// that do not exist (pvolume.Volumes.Check).
func (n *Node) checkVolumes(ctx context.Context, req journal.ClaimRequest) error {
	return n.pvolumes().Check(ctx, req)
}

// admitVolumes refuses a volume another generation holds (pvolume.Admit).
func admitVolumes(live []journal.Sandbox, rec journal.Sandbox) error { return pvolume.Admit(live, rec) }

// deadWriters are the writers of ready generation s that a takeover finds
// not running with their journaled epochs (writers.Watch.Dead).
func (n *Node) deadWriters(ctx context.Context, s journal.Sandbox) []string {
	return n.writers().Dead(ctx, s)
}

// restartWriter starts the next writer of volume vol ("": the root's) of
// s on its device (writers.Watch.Restart).
func (n *Node) restartWriter(ctx context.Context, s journal.Sandbox, vol string, cause error) (journal.Sandbox, error) {
	return n.writers().Restart(ctx, s, vol, cause)
}
