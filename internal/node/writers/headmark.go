package writers

import (
	"fmt"
	"log/slog"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/op"
)

// Rollback by the bucket (issue 21): the store's head of a volume is the
// highest head object it lists, and whoever controls the bucket can
// delete the newest one or put back a saved older one (it authenticates:
// same name, same key). So a resume and an attach take the store's head
// only if it is not below a floor: the node's own high-water mark of the
// volume (journal.HeadMark: every head it read or published) and the
// head the claim expects (the manager's record). Below is a conflict and
// nothing is started; at or above, the mark moves up to it.

// SandboxVolume and PersistentVolume are the store's names of the marks.
func SandboxVolume(id string) string    { return blockstore.Sandbox(id).String() }
func PersistentVolume(id string) string { return blockstore.Vol(id).String() }

// belowFloor says whether got is below floor: a lower Seq, or the same
// Seq over another generation (a zero floor bounds nothing).
func belowFloor(got, floor journal.VolumeHead) bool {
	return floor.Seq > 0 && (got.Seq < floor.Seq || got.Seq == floor.Seq && got.Generation != floor.Generation)
}

// checkHeadFloor is the floor check as plain data: nil, or a conflict
// that names the store's head and the floor it is below.
func checkHeadFloor(vol string, got journal.VolumeHead, mark journal.HeadMark, expect journal.VolumeHead) error {
	for _, f := range []struct {
		who   string
		floor journal.VolumeHead
	}{
		{"this node's journal", journal.VolumeHead{Seq: mark.Seq, Generation: mark.Generation}},
		{"the claim", expect},
	} {
		if belowFloor(got, f.floor) {
			return errdefs.Errorf(errdefs.CodeConflict,
				"head of %s: the block store has head %d (generation %d), below head %d (generation %d) that %s has seen: the store lost or rolled back its newest head (or the volume was deleted); refusing to run an older disk",
				vol, got.Seq, got.Generation, f.floor.Seq, f.floor.Generation, f.who)
		}
	}
	return nil
}

// Marks are the node's head marks of volumes, in its journal.
type Marks struct {
	Journal *journal.Journal
	Log     *slog.Logger
}

// Floor checks got, the store's head of vol, against the node's mark and
// expect, and raises the mark to it.
func (m Marks) Floor(vol string, got, expect journal.VolumeHead) error {
	err := m.Journal.Update(func(tx *journal.Tx) error {
		mark, err := tx.HeadMark(vol)
		if err != nil {
			return fmt.Errorf("read head mark: %w", err)
		}
		if err := checkHeadFloor(vol, got, mark, expect); err != nil {
			return err
		}
		_, err = tx.RaiseHeadMark(vol, got.Seq, got.Generation)
		return err
	})
	if err != nil {
		m.Log.Error("head of a volume not taken", "volume", vol, "err", err)
		return op.TxErr("journal head mark of "+vol, err)
	}
	return nil
}

// Note raises vol's mark to h, a head this node published.
func (m Marks) Note(vol string, h journal.VolumeHead) error {
	return m.Journal.Update(func(tx *journal.Tx) error { return RaiseMark(tx, vol, h) })
}

// RaiseMark raises vol's mark to h inside tx (a publish's journal write).
func RaiseMark(tx *journal.Tx, vol string, h journal.VolumeHead) error {
	if _, err := tx.RaiseHeadMark(vol, h.Seq, h.Generation); err != nil {
		return fmt.Errorf("raise head mark of %s: %w", vol, err)
	}
	return nil
}
