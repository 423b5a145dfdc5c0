package blockstore_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/ctld/ctld/internal/blockstore"
)

// Image.Child of a parent's image and a manifest committed over it
// reads, zero-checks and chains exactly as the generation opened from
// the store; a manifest that is not the image's child is refused.
func TestImageChildIsOpen(t *testing.T) {
	f := newFixture(t, blockstore.Options{})
	ctx := context.Background()
	size := uint64(8 * cs)
	if _, err := f.repo.Commit(ctx, blockstore.CommitSpec{Generation: tpl0, DeviceSize: size, ChunkSize: cs},
		map[uint64][]byte{0: randChunk(t), 2: randChunk(t), 5: randChunk(t)}); err != nil {
		t.Fatal(err)
	}
	m, err := f.repo.Commit(ctx, blockstore.CommitSpec{Generation: sb1, Parent: &tpl0, DeviceSize: size},
		map[uint64][]byte{2: nil, 3: randChunk(t), 5: randChunk(t)})
	if err != nil {
		t.Fatal(err)
	}
	parent, err := f.repo.Open(ctx, tpl0)
	if err != nil {
		t.Fatal(err)
	}
	child, err := parent.Child(m)
	if err != nil {
		t.Fatal(err)
	}
	opened, err := f.repo.Open(ctx, sb1)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(child.Chain(), opened.Chain()) {
		t.Fatalf("Child's chain %v, Open's %v", child.Chain(), opened.Chain())
	}
	a, b := make([]byte, cs), make([]byte, cs)
	for i := uint64(0); i < child.Chunks(); i++ {
		if child.IsZero(i) != opened.IsZero(i) {
			t.Fatalf("chunk %d: Child IsZero %v, Open %v", i, child.IsZero(i), opened.IsZero(i))
		}
		if err := child.ReadChunk(ctx, i, a); err != nil {
			t.Fatal(err)
		}
		if err := opened.ReadChunk(ctx, i, b); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(a, b) {
			t.Fatalf("chunk %d differs between Child and Open", i)
		}
	}
	if _, err := opened.Child(m); !errors.Is(err, blockstore.ErrInvalidManifest) {
		t.Fatalf("Child of a manifest that is not the image's child: %v, want ErrInvalidManifest", err)
	}
}

// GenRef.String is parsed back by ParseGenRef, and what is not one is refused.
func TestParseGenRef(t *testing.T) {
	for _, r := range []blockstore.GenRef{tpl0, sb1, {Volume: blockstore.Sandbox("a-9"), Generation: 1 << 60}} {
		got, err := blockstore.ParseGenRef(r.String())
		if err != nil || got != r {
			t.Fatalf("ParseGenRef(%q) = %v, %v", r.String(), got, err)
		}
	}
	for _, s := range []string{"", "sandboxes/sb-1", "sandboxes/sb-1@", "sandboxes/sb-1@-1", "sandboxes/sb-1@x", "nokind@1", "other/x@1"} {
		if got, err := blockstore.ParseGenRef(s); err == nil {
			t.Fatalf("ParseGenRef(%q) = %v, want an error", s, got)
		}
	}
}
