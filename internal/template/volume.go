package template

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ctld/ctld/internal/blockstore"
)

// Persistent volumes: a block-store volume of kind volumes holding an
// ext4 file system of its own, attached to one sandbox at a time. Create
// makes generation 0 (an empty file system) and publishes head 1 over it;
// from then on each detach publishes the next head, and the volume is
// what its head names.

var (
	// ErrVolumeExists: a volume of that ID is in the store already (or
	// was deleted and GC has not freed it yet).
	ErrVolumeExists = errors.New("volume exists")
	// ErrVolumeNotFound: no volume of that ID (or it was deleted).
	ErrVolumeNotFound = errors.New("volume not found")
)

// CreateVolumeNode is the node name in the head Create publishes.
const CreateVolumeNode = "ctl-manager"

// CreateVolume makes persistent volume id of size bytes (a positive
// multiple of the chunk size): an empty ext4 image built in tmpDir
// (removed after), stored as generation 0, published as head 1. A crash
// before the publish leaves a generation without a head, which
// ListVolumes leaves out and GC frees.
func CreateVolume(ctx context.Context, repo *blockstore.Repo, id string, size int64, tmpDir string) (blockstore.Head, error) {
	vol := blockstore.Vol(id)
	if err := vol.Check(); err != nil {
		return blockstore.Head{}, fmt.Errorf("create volume %q: %w", id, err)
	}
	if size <= 0 || size%blockstore.DefaultChunkSize != 0 {
		return blockstore.Head{}, fmt.Errorf("create volume %s: size %d is not a positive multiple of %d", id, size, blockstore.DefaultChunkSize)
	}
	if gens, err := repo.Generations(ctx, vol); err != nil {
		return blockstore.Head{}, fmt.Errorf("create volume %s: %w", id, err)
	} else if len(gens) > 0 {
		return blockstore.Head{}, fmt.Errorf("create volume %s: %w", id, ErrVolumeExists)
	}
	dir, err := os.MkdirTemp(tmpDir, "volume-create-")
	if err != nil {
		return blockstore.Head{}, fmt.Errorf("create volume %s: %w", id, err)
	}
	defer os.RemoveAll(dir)
	empty := filepath.Join(dir, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		return blockstore.Head{}, fmt.Errorf("create volume %s: %w", id, err)
	}
	img := filepath.Join(dir, "volume.ext4")
	if _, err := BuildImage(ctx, Source{Kind: KindDir, Path: empty}, img, ImageOptions{Size: size}); err != nil {
		return blockstore.Head{}, fmt.Errorf("create volume %s: %w", id, err)
	}
	if _, err := importImage(ctx, repo, vol, img, nil, nil); err != nil {
		if errors.Is(err, blockstore.ErrExists) {
			return blockstore.Head{}, fmt.Errorf("create volume %s: %w", id, ErrVolumeExists)
		}
		return blockstore.Head{}, fmt.Errorf("create volume %s: %w", id, err)
	}
	h, err := repo.Publish(ctx, vol, blockstore.Head{}, blockstore.Head{Generation: 0, Node: CreateVolumeNode})
	if err != nil {
		return blockstore.Head{}, fmt.Errorf("create volume %s: %w", id, err)
	}
	return h, nil
}

// VolumeInfo is one persistent volume of a store.
type VolumeInfo struct {
	ID         string
	DeviceSize uint64
	Head       blockstore.Head
}

// ListVolumes returns the persistent volumes with a head, by ID (a
// deleted volume has none, nor does a create that did not finish).
func ListVolumes(ctx context.Context, store blockstore.Store, repo *blockstore.Repo) ([]VolumeInfo, error) {
	prefix := string(blockstore.KindVolume) + "/"
	keys, err := store.List(ctx, prefix)
	if err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	var out []VolumeInfo
	seen := map[string]bool{}
	for _, k := range keys {
		id, _, ok := strings.Cut(strings.TrimPrefix(k, prefix), "/")
		if !ok || seen[id] {
			continue
		}
		seen[id] = true
		vol := blockstore.Vol(id)
		if vol.Check() != nil {
			continue
		}
		h, err := repo.Head(ctx, vol)
		if err != nil {
			return nil, fmt.Errorf("list volumes: %w", err)
		}
		if h.Seq == 0 {
			continue
		}
		m, err := repo.Manifest(ctx, blockstore.GenRef{Volume: vol, Generation: h.Generation})
		if err != nil {
			return nil, fmt.Errorf("list volumes: %w", err)
		}
		out = append(out, VolumeInfo{ID: id, DeviceSize: m.DeviceSize, Head: h})
	}
	slices.SortFunc(out, func(a, b VolumeInfo) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// RemoveVolume deletes persistent volume id (its heads; its data goes at
// the next GC). The caller makes sure no sandbox has it attached: a
// writer's publish after this is fenced, and its data lost.
func RemoveVolume(ctx context.Context, repo *blockstore.Repo, id string) error {
	vol := blockstore.Vol(id)
	if err := vol.Check(); err != nil {
		return fmt.Errorf("remove volume %q: %w", id, err)
	}
	h, err := repo.Head(ctx, vol)
	if err != nil {
		return fmt.Errorf("remove volume %s: %w", id, err)
	}
	if h.Seq == 0 {
		return fmt.Errorf("remove volume %s: %w", id, ErrVolumeNotFound)
	}
	if err := repo.DeleteVolume(ctx, vol); err != nil {
		return fmt.Errorf("remove volume %s: %w", id, err)
	}
	return nil
}
