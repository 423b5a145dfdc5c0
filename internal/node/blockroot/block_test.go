package blockroot

import (
	"context"
	"testing"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/fakekernel"
	"github.com/ctld/ctld/internal/node/writers"
)

// TestCheck: a block claim is refused before the journal when the node
// has no block subsystems (unavailable), the template is not in the
// store (not_found) or its disk lease is not the device size
// (invalid_argument); an unnamed disk lease becomes the device size.
func TestCheck(t *testing.T) {
	k, err := fakekernel.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	req := func(template string, disk int64) *journal.ClaimRequest {
		return &journal.ClaimRequest{RootFS: journal.RootFS{Mode: journal.RootFSBlock, Template: template}, Resources: journal.Resources{DiskBytes: disk}}
	}
	none := New(Wiring{})
	if err := none.Check(ctx, "sb", req("busybox", 0)); errdefs.CodeOf(err) != errdefs.CodeUnavailable {
		t.Errorf("no block subsystems: %v, want unavailable", err)
	}
	root := New(Wiring{Shared: writers.Shared{Writers: writers.Deps{Devices: k.Blocks()}}, Deps: Deps{Mounts: k.BlockMounts(), Templates: k.Templates()}})
	if err := root.Check(ctx, "sb", req("nope", 0)); errdefs.CodeOf(err) != errdefs.CodeNotFound {
		t.Errorf("unknown template: %v, want not_found", err)
	}
	if err := root.Check(ctx, "sb", req("busybox", fakekernel.TemplateSize+1)); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
		t.Errorf("disk lease other than the device size: %v, want invalid_argument", err)
	}
	r := req("busybox", 0)
	if err := root.Check(ctx, "sb", r); err != nil || r.Resources.DiskBytes != fakekernel.TemplateSize {
		t.Errorf("unnamed disk lease: %v, disk %d, want the device size %d", err, r.Resources.DiskBytes, fakekernel.TemplateSize)
	}
}

// TestSealable: only a ready block-mode generation is durable.
func TestSealable(t *testing.T) {
	block := journal.RootFS{Mode: journal.RootFSBlock}
	cases := []struct {
		name string
		s    journal.Sandbox
		code errdefs.Code
	}{
		{"ready block", journal.Sandbox{ID: "s", State: journal.StateReady, RootFS: block, Block: &journal.BlockDevice{}}, ""},
		{"overlay", journal.Sandbox{ID: "s", State: journal.StateReady}, errdefs.CodeInvalidArgument},
		{"claiming", journal.Sandbox{ID: "s", State: journal.StateClaiming, RootFS: block, Block: &journal.BlockDevice{}}, errdefs.CodeConflict},
		{"no writer record", journal.Sandbox{ID: "s", State: journal.StateReady, RootFS: block}, errdefs.CodeConflict},
	}
	for _, c := range cases {
		if err := sealable(c.s, "pause"); errdefs.CodeOf(err) != c.code {
			t.Errorf("%s: %v, want code %q", c.name, err, c.code)
		}
	}
}
