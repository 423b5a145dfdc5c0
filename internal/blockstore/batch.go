package blockstore

import "context"

// Batcher is an optional Store extension for a Writer's chunks: their
// objects go into one Batch, made durable together when the Writer
// commits, instead of one durable Put each (dirstore: the syncs all at
// the commit, none in between, and none that orders one chunk's upload
// after another's).
type Batcher interface {
	NewBatch() Batch
}

// Batch stages objects. Put writes one (safe for concurrent use): neither
// visible nor durable yet. Commit makes every staged object durable and
// then visible under its key (a key that exists keeps its object, which
// is whole by Store's contract): when it returns without error each key
// put reads back and survives a crash, so a manifest Put after it names
// only durable chunks. Before Commit nothing staged is visible; a crash
// or an error during it may leave some of the objects visible, each
// whole. Abort drops what is staged.
type Batch interface {
	Put(ctx context.Context, key string, data []byte) error
	Commit(ctx context.Context) error
	Abort()
}
