package dirstore

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/ctld/ctld/internal/blockstore"
)

var _ blockstore.Batcher = (*Store)(nil)

// NewBatch starts a batch of objects made durable together at its
// commit: a Writer's chunks cost an fsync each (16 at a time) and one per
// directory, all at the commit, where a durable Put each costs a file and
// a directory fsync in turn (or, with syncFS, two syncfs(2) in all).
func (s *Store) NewBatch() blockstore.Batch { return &batch{s: s} }

// batch stages objects as hidden temp files beside their names, unsynced.
// Commit makes every staged object's data durable first (syncData), and
// only then links each to its name: a name never points at data a crash
// could lose (a visible object is whole, as Put's are); then the names
// are made durable (syncNames) before Commit returns, so a manifest
// written after it names only durable chunks.
type batch struct {
	s    *Store
	mu   sync.Mutex
	tmps []staged
	done bool
}

type staged struct{ tmp, path string }

// Put stages key (safe for concurrent use).
func (b *batch) Put(ctx context.Context, key string, data []byte) error {
	if err := blockstore.CheckKey(key); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	p := b.s.path(key)
	dir := filepath.Dir(p)
	// Not durable yet: Commit syncs the directories up to the root.
	if err := mkdirs(b.s.ops, dir, false); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	tmp, err := b.s.ops.writeTemp(dir, filepath.Base(p), data, false)
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		_ = b.s.ops.remove(tmp)
		return fmt.Errorf("put %s: batch finished", key)
	}
	b.tmps = append(b.tmps, staged{tmp: tmp, path: p})
	return nil
}

// Commit makes every staged object durable and visible. An object whose
// key exists keeps the stored one (objects are immutable and named by
// content here; a visible object is whole). On an error some objects may
// be visible, each whole; none is promised durable.
func (b *batch) Commit(ctx context.Context) error {
	b.mu.Lock()
	tmps, done := b.tmps, b.done
	b.tmps, b.done = nil, true
	b.mu.Unlock()
	if done {
		return errors.New("commit batch: finished")
	}
	defer b.drop(tmps)
	if len(tmps) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("commit batch: %w", err)
	}
	// Data first: after this no link below can expose a torn object.
	if err := b.syncData(ctx, tmps); err != nil {
		return fmt.Errorf("commit batch: %w", err)
	}
	for _, t := range tmps {
		if err := b.s.ops.link(t.tmp, t.path); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("commit batch: link %s: %w", t.path, err)
		}
	}
	// Then the names.
	if err := b.syncNames(ctx, tmps); err != nil {
		return fmt.Errorf("commit batch: %w", err)
	}
	return nil
}

// syncData makes the staged files' data durable: an fsync of each,
// syncJobs at a time (or one syncfs).
func (b *batch) syncData(ctx context.Context, tmps []staged) error {
	if b.s.syncFS {
		return b.s.ops.syncFS(b.s.root)
	}
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(syncJobs)
	for _, t := range tmps {
		g.Go(func() error {
			if err := ctx.Err(); err != nil {
				return err
			}
			return b.s.ops.syncFile(t.tmp)
		})
	}
	return g.Wait()
}

// syncNames makes the links durable: an fsync of each directory they are
// in and of every directory above it up to the root, as Put made missing
// directories without syncing their parents (or one syncfs).
func (b *batch) syncNames(ctx context.Context, tmps []staged) error {
	if b.s.syncFS {
		return b.s.ops.syncFS(b.s.root)
	}
	dirs := map[string]bool{}
	for _, t := range tmps {
		for d := filepath.Dir(t.path); !dirs[d]; d = filepath.Dir(d) {
			dirs[d] = true
			if d == b.s.root || len(d) <= len(b.s.root) {
				break
			}
		}
	}
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(syncJobs)
	for d := range dirs {
		g.Go(func() error {
			if err := ctx.Err(); err != nil {
				return err
			}
			return b.s.ops.syncDir(d)
		})
	}
	return g.Wait()
}

// syncJobs bounds a per-file batch's concurrent fsyncs.
const syncJobs = 16

// Abort drops the staged objects.
func (b *batch) Abort() {
	b.mu.Lock()
	tmps := b.tmps
	b.tmps, b.done = nil, true
	b.mu.Unlock()
	b.drop(tmps)
}

// drop removes the temp names (a linked object keeps its own).
func (b *batch) drop(tmps []staged) {
	for _, t := range tmps {
		_ = b.s.ops.remove(t.tmp)
	}
}
