package template

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/ctld/ctld/internal/blockstore"
)

// A registry template's block image is stored once per image key (its
// layers, by digest and in order, built at one size, file system and
// label by this builder: the same tree, whatever the image config says)
// as a hidden template volume, its base; every template of that key is a
// fork of the base (blockstore.Fork: one manifest object). So a second
// template of the same layers pulls, unpacks, builds and uploads nothing.
// The base's metadata keeps what the templates still need of the tree:
// its /etc/passwd and /etc/group (to resolve each config's user) and the
// build's result.

// sourceBase is the Meta.Source of a base.
const sourceBase = "image-base"

// basePrefix starts a base's volume ID: "img-" and 56 hex digits of the
// image key (a user template of such a name is never taken for a base:
// its metadata says what it is).
const basePrefix = "img-"

// builderVersion changes when what an import builds from the same layers
// changes: older bases are then not reused.
const builderVersion = "1"

// maxBaseIDs bounds the /etc/passwd and /etc/group a base keeps (its
// metadata is at most blockstore.MaxMetaBytes, and these are base64 in
// it); a tree with larger ones gets a base that serves only images
// without a user.
const maxBaseIDs = 128 << 10

// baseMeta is a base's metadata.
type baseMeta struct {
	Source string   `json:"source"` // sourceBase
	Key    string   `json:"image_key"`
	Layers []string `json:"layers"`
	// Passwd and Group are the tree's files; HasIDs says they were kept
	// (a tree without them has HasIDs and none).
	Passwd  []byte    `json:"passwd,omitempty"`
	Group   []byte    `json:"group,omitempty"`
	HasIDs  bool      `json:"has_ids"`
	Entries int64     `json:"entries"`
	Bytes   int64     `json:"bytes"`
	Skipped []Skipped `json:"skipped,omitempty"`
}

// imageKey is the key of the image an import of layers makes with o.
func imageKey(layers []v1.Descriptor, o ImageOptions) string {
	h := sha256.New()
	fmt.Fprintf(h, "ctld template image %s\nsize %d\nfs %s\nlabel %q\n", builderVersion, o.Size, cmp.Or(o.FSType, "ext4"), o.Label)
	for _, l := range layers {
		fmt.Fprintf(h, "layer %s\n", l.Digest)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func baseVolume(key string) blockstore.Volume { return blockstore.Template(basePrefix + key[:56]) }

// readBase returns the base of key: ok when its metadata says it is that
// base; stored when its image (generation 0) is committed too.
func readBase(ctx context.Context, repo *blockstore.Repo, key string) (bm baseMeta, ok, stored bool, err error) {
	vol := baseVolume(key)
	b, err := repo.Meta(ctx, vol)
	if errors.Is(err, blockstore.ErrNotFound) {
		return bm, false, false, nil
	}
	if err != nil {
		return bm, false, false, fmt.Errorf("read image %s: %w", vol.ID, err)
	}
	if err := json.Unmarshal(b, &bm); err != nil || bm.Source != sourceBase || bm.Key != key {
		return baseMeta{}, false, false, nil // a template of that name, not our base
	}
	gens, err := repo.Generations(ctx, vol)
	if err != nil {
		return bm, false, false, fmt.Errorf("read image %s: %w", vol.ID, err)
	}
	return bm, true, len(gens) > 0, nil
}

// storeBase stores the image file img as the base of key with bm: a base
// that exists already (another import of the same layers) is kept, ours
// dropped. ok is false when the name is another template's: the caller
// stores its own image then.
func storeBase(ctx context.Context, repo *blockstore.Repo, key, img string, bm baseMeta, progress func(Progress)) (ok bool, err error) {
	vol := baseVolume(key)
	b, err := json.Marshal(bm)
	if err != nil {
		return false, fmt.Errorf("store image %s: %w", vol.ID, err)
	}
	if err := repo.PutMeta(ctx, vol, b); errors.Is(err, blockstore.ErrExists) {
		// Another import's (or what a crashed one left): ours if it is
		// the base of key.
		if _, ok, _, err := readBase(ctx, repo, key); err != nil || !ok {
			return false, err
		}
	} else if err != nil {
		return false, fmt.Errorf("store image %s: %w", vol.ID, err)
	}
	if _, err := importImage(ctx, repo, vol, img, progress, func(ctx context.Context) error { return checkImage(ctx, img) }); err != nil && !errors.Is(err, blockstore.ErrExists) {
		return false, fmt.Errorf("store image %s: %w", vol.ID, err)
	}
	return true, nil
}

// forkBase makes template vol a fork of the base of key, with meta: the
// metadata first, so a template that exists has it; a failed fork takes
// it back (unless another import of the name won).
func forkBase(ctx context.Context, repo *blockstore.Repo, vol blockstore.Volume, key string, meta Meta) (*blockstore.Manifest, error) {
	if err := putTemplateMeta(ctx, repo, vol, meta); err != nil {
		return nil, err
	}
	return forkMeta(ctx, repo, vol, key)
}

// putTemplateMeta writes template vol's metadata (create-once: a name
// another import holds is ErrTemplateExists).
func putTemplateMeta(ctx context.Context, repo *blockstore.Repo, vol blockstore.Volume, meta Meta) error {
	b, err := json.Marshal(meta)
	if err != nil {
		return err
	}
	if err := repo.PutMeta(ctx, vol, b); err != nil {
		if errors.Is(err, blockstore.ErrExists) {
			err = fmt.Errorf("%w: %w", ErrTemplateExists, err)
		}
		return err
	}
	return nil
}

// forkMeta makes template vol, whose metadata putTemplateMeta wrote, a
// fork of the base of key; a failed fork takes the metadata back (unless
// another import of the name won).
func forkMeta(ctx context.Context, repo *blockstore.Repo, vol blockstore.Volume, key string) (*blockstore.Manifest, error) {
	m, err := repo.Fork(ctx, blockstore.GenRef{Volume: baseVolume(key)}, vol)
	if err != nil {
		if errors.Is(err, blockstore.ErrExists) {
			return nil, fmt.Errorf("%w: %w", ErrTemplateExists, err)
		}
		if derr := repo.DeleteMeta(context.WithoutCancel(ctx), vol); derr != nil {
			err = errors.Join(err, derr)
		}
		return nil, err
	}
	return m, nil
}

// isBase reports whether template volume ID id is named like a base.
func isBase(id string) bool {
	return strings.HasPrefix(id, basePrefix) && len(id) == len(basePrefix)+56
}

// maxBaseSkipped bounds the skipped entries a base keeps (names and
// reasons together): its metadata has a size limit, and an image may
// skip millions of device nodes.
const maxBaseSkipped = 16 << 10

// keptSkipped is the first of skipped that fit in maxBaseSkipped.
func keptSkipped(skipped []Skipped) []Skipped {
	n := 0
	for i, s := range skipped {
		if n += len(s.Path) + len(s.Reason); n > maxBaseSkipped {
			return skipped[:i]
		}
	}
	return skipped
}
