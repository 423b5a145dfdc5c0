package blockvol_test

import (
	"context"
	"testing"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/blockstore/dirstore"
	"github.com/ctld/ctld/internal/blockvol"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
)

// TestForkFromFencesAHeadlessVolume: on a real (directory) block store a
// sandbox volume with no head gets generation 0 forked from its
// template's, which a head at a takeover's writer epoch can name; a
// publish that expects no head (the lost writer's) is then fenced, and a
// second fork is a conflict.
func TestForkFromFencesAHeadlessVolume(t *testing.T) {
	ctx := context.Background()
	ds, err := dirstore.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	nk, _, err := blockstore.GenerateNodeKey("node-b")
	if err != nil {
		t.Fatal(err)
	}
	repo, err := blockstore.New(ds, nk, blockstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	const cs = 64 << 10
	tpl := blockstore.GenRef{Volume: blockstore.Template("busybox")}
	if _, err := repo.Commit(ctx, blockstore.CommitSpec{Generation: tpl, DeviceSize: 4 * cs, ChunkSize: cs}, map[uint64][]byte{1: make([]byte, cs)}); err != nil {
		t.Fatal(err)
	}
	v := blockvol.Volumes{Repo: repo}
	if err := v.ForkFrom(ctx, tpl, "sb"); err != nil {
		t.Fatal(err)
	}
	if size, err := v.DeviceSize(ctx, "sb", 0); err != nil || size != 4*cs {
		t.Fatalf("the fork's device size %d, %v; want the template's %d", size, err, 4*cs)
	}
	h, err := v.Publish(ctx, "sb", journal.VolumeHead{}, journal.VolumeHead{Generation: 0, WriterEpoch: 2, Node: "b"})
	if err != nil || h.Seq != 1 {
		t.Fatalf("publish the fork as the first head: %+v, %v", h, err)
	}
	if _, err := v.Publish(ctx, "sb", journal.VolumeHead{}, journal.VolumeHead{Generation: 0, WriterEpoch: 1, Node: "a"}); errdefs.CodeOf(err) != errdefs.CodeFenced {
		t.Fatalf("a publish expecting no head after the fence: %v, want fenced", err)
	}
	if err := v.ForkFrom(ctx, tpl, "sb"); errdefs.CodeOf(err) != errdefs.CodeConflict {
		t.Fatalf("a second fork into the volume: %v, want conflict", err)
	}
}
