package node

import (
	"context"

	"github.com/ctld/ctld/internal/journal"
)

// identify reads from the kernel the identities of rec's overlay
// superblock and netns that are not journaled yet, journals them in the
// sandbox record and returns rec with them. Claim journals them with the
// netns entry's done record; teardown calls identify before removing
// anything, which covers a crash in between. An object that is already
// gone cannot be identified: its proof check then falls back to names
// (and says so).
func (n *Node) identify(ctx context.Context, rec journal.Sandbox) journal.Sandbox {
	if n.live() != nil {
		return rec // no journal write after the term; the successor identifies
	}
	rec, changed := n.readIdentities(ctx, rec)
	if !changed {
		return rec
	}
	if err := n.d.Journal.Update(func(tx *journal.Tx) error { return putIdentities(tx, rec) }); err != nil {
		n.log.Warn("journal kernel identities", "sandbox", rec.ID, "generation", rec.Generation, "err", err)
	}
	return rec
}

// readIdentities returns rec with the kernel identities of its objects
// that it does not have yet, and whether it found any.
func (n *Node) readIdentities(ctx context.Context, rec journal.Sandbox) (journal.Sandbox, bool) {
	if n.live() != nil {
		return rec, false
	}
	cid := rec.ContainerID
	changed := false
	if rec.RootDev == "" {
		if dev, err := n.d.Overlay.RootFS.Superblock(cid); err == nil {
			rec.RootDev, changed = dev, true
		}
	}
	if r, ok := n.net.IdentifyNetns(ctx, rec); ok {
		rec, changed = r, true
	}
	if r, ok := n.identifyBlock(ctx, rec); ok {
		rec, changed = r, true
	}
	return rec, changed
}

// putIdentities journals rec's kernel identities in its sandbox record
// (if it is still rec's generation).
func putIdentities(tx *journal.Tx, rec journal.Sandbox) error {
	s, ok, err := tx.Sandbox(rec.ID)
	if err != nil || !ok || s.Generation != rec.Generation {
		return err
	}
	s.RootDev, s.NetnsDev, s.NetnsIno, s.NetnsCookie = rec.RootDev, rec.NetnsDev, rec.NetnsIno, rec.NetnsCookie
	if rec.Block != nil {
		s.Block = rec.Block
	}
	return tx.PutSandbox(s)
}
