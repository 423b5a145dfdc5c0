package blockstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// GCOptions tune a GC.
type GCOptions struct {
	// Grace protects young objects: nothing modified less than Grace ago
	// is deleted, and every manifest that young is a root. It must cover
	// a seal (chunks are written before their manifest, the head after
	// it) and a fork until its head is published. Required (> 0).
	Grace time.Duration
	// DryRun deletes nothing; the report says what would go.
	DryRun bool
	// Now is the clock object ages are measured against (default
	// time.Now). Object times are the store's: its clock and ours must
	// agree to well within Grace.
	Now func() time.Time
}

// GC object kinds, the keys of GCReport's counts.
const (
	GCChunk     = "chunk"
	GCPack      = "pack"
	GCManifest  = "manifest"
	GCHead      = "head"
	GCSnapshot  = "snapshot"
	GCKey       = "key"
	GCTombstone = "tombstone"
	GCOther     = "other" // not a block store object: never deleted
)

// GCReport says what a GC kept and deleted.
type GCReport struct {
	Kept    map[string]int // objects kept, by kind (GCChunk, ...)
	Deleted map[string]int // objects deleted (DryRun: to be deleted), by kind
	// BytesFreed is the size of the deleted objects.
	BytesFreed int64
	// DeletedKeys are the keys a DryRun would delete, in deletion order.
	DeletedKeys []string
}

// gcObj is one listed object, classified.
type gcObj struct {
	ObjectInfo
	kind string
	seq  uint64 // head seq, manifest generation
	name string // snapshot name
}

// gcVol is the inventory of one volume.
type gcVol struct {
	v         Volume
	heads     []gcObj // ascending seq
	snaps     []gcObj
	gens      []gcObj // ascending generation
	chunks    []gcObj // loose chunk objects and packs
	key, tomb *gcObj
	other     []gcObj
}

// gcRun is one GC's state.
type gcRun struct {
	r      *Repo
	cutoff time.Time
	vols   map[Volume]*gcVol
	other  []gcObj // outside any volume
	seen   map[string]bool
	marked map[string]bool
	walked map[GenRef]bool
}

// GC frees what no root reaches. The roots are the latest head of every
// volume, every snapshot, every generation of every template, and every
// manifest younger than Grace (a seal or fork in flight); a deleted
// volume (DeleteVolume) has none but its young manifests. Mark walks each
// root's parent chain (across volumes: forks, templates) and keeps its
// manifests, chunks and keys; sweep deletes the unreachable chunks and
// manifests, superseded heads, the heads and snapshots a crashed
// DeleteVolume left, and the key and tombstone of a volume with nothing
// left, but only objects older than Grace. Objects it does not recognise
// are never deleted.
//
// Crash-safe: mark completes before the first delete, and any error while
// marking (a root that does not open, a tampered head) stops GC with
// nothing deleted. The deletion order (see sweep) keeps every manifest
// left in the store whole, so a GC stopped anywhere leaves only garbage
// the next GC frees.
//
// New references made while GC runs must name what is already reachable
// (the head's chain, a snapshot, a template): Publish, PutSnapshot and
// Fork of such generations are safe. Known limit: a commit that reuses an
// unreferenced chunk object older than Grace (a retried seal whose first
// attempt died long ago; Put's ErrExists counts as stored) can lose that
// chunk to a GC running at the same moment.
//
// The store must be a Lister (object ages).
func (r *Repo) GC(ctx context.Context, opts GCOptions) (GCReport, error) {
	rep := GCReport{Kept: map[string]int{}, Deleted: map[string]int{}}
	if _, ok := r.store.(Lister); !ok {
		return rep, fmt.Errorf("gc: the store (%T) does not list modification times (blockstore.Lister)", r.store)
	}
	if opts.Grace <= 0 {
		return rep, fmt.Errorf("gc: grace %s: it must be positive (uploads in flight are younger than it)", opts.Grace)
	}
	now := time.Now
	if opts.Now != nil {
		now = opts.Now
	}
	g := &gcRun{
		r: r, cutoff: now().Add(-opts.Grace),
		vols: map[Volume]*gcVol{}, seen: map[string]bool{},
		marked: map[string]bool{}, walked: map[GenRef]bool{},
	}
	// Mark: inventory, roots, their chains.
	fresh, err := g.inventory(ctx)
	if err != nil {
		return rep, err
	}
	if err := g.markRoots(ctx, fresh); err != nil {
		return rep, err
	}
	// Again, for what was published or committed while we marked: it
	// names generations that were reachable then, which the first mark
	// may have missed only if they are new. This narrows the race with
	// concurrent writers to the time between here and the deletes.
	if fresh, err = g.inventory(ctx); err != nil {
		return rep, err
	}
	if err := g.markRoots(ctx, fresh); err != nil {
		return rep, err
	}
	return g.sweep(ctx, opts.DryRun, rep)
}

// inventory lists the store's volumes' objects and classifies those not
// seen before; it returns the volumes that got new ones.
func (g *gcRun) inventory(ctx context.Context) (map[Volume]bool, error) {
	lister := g.r.store.(Lister)
	fresh := map[Volume]bool{}
	for _, kind := range VolumeKinds {
		infos, err := lister.ListInfo(ctx, string(kind)+"/")
		if err != nil {
			return nil, fmt.Errorf("gc: %w", err)
		}
		for _, oi := range infos {
			if g.seen[oi.Key] {
				continue
			}
			g.seen[oi.Key] = true
			o, v, ok := classify(oi)
			if !ok {
				g.other = append(g.other, o)
				continue
			}
			vi := g.vols[v]
			if vi == nil {
				vi = &gcVol{v: v}
				g.vols[v] = vi
			}
			fresh[v] = true
			switch o.kind {
			case GCHead:
				vi.heads = insertBySeq(vi.heads, o)
			case GCSnapshot:
				vi.snaps = append(vi.snaps, o)
			case GCManifest:
				vi.gens = insertBySeq(vi.gens, o)
			case GCChunk, GCPack:
				vi.chunks = append(vi.chunks, o)
			case GCKey:
				vi.key = &o
			case GCTombstone:
				vi.tomb = &o
			default:
				vi.other = append(vi.other, o)
			}
		}
	}
	return fresh, nil
}

// insertBySeq adds o keeping objs sorted by seq (a second inventory's
// objects arrive after the first's).
func insertBySeq(objs []gcObj, o gcObj) []gcObj {
	i := len(objs)
	for i > 0 && objs[i-1].seq > o.seq {
		i--
	}
	objs = append(objs, gcObj{})
	copy(objs[i+1:], objs[i:])
	objs[i] = o
	return objs
}

// classify names what a listed key is: its volume and kind (GCOther, and
// ok false without a volume, for anything else).
func classify(oi ObjectInfo) (gcObj, Volume, bool) {
	o := gcObj{ObjectInfo: oi, kind: GCOther}
	parts := strings.SplitN(oi.Key, "/", 3)
	if len(parts) != 3 {
		return o, Volume{}, false
	}
	v, err := ParseVolume(parts[0] + "/" + parts[1])
	if err != nil {
		return o, Volume{}, false
	}
	rest := parts[2]
	seq := func(s string) (uint64, bool) {
		n, err := strconv.ParseUint(s, 10, 64)
		return n, err == nil && len(s) == 20
	}
	switch {
	case rest == "key":
		o.kind = GCKey
	case rest == "deleted":
		o.kind = GCTombstone
	case strings.HasPrefix(rest, "gen/"):
		if n, ok := seq(rest[len("gen/"):]); ok {
			o.kind, o.seq = GCManifest, n
		}
	case strings.HasPrefix(rest, "head/"):
		if n, ok := seq(rest[len("head/"):]); ok && n > 0 {
			o.kind, o.seq = GCHead, n
		}
	case strings.HasPrefix(rest, "snap/"):
		if name := rest[len("snap/"):]; CheckSnapshotName(name) == nil {
			o.kind, o.name = GCSnapshot, name
		}
	case strings.HasPrefix(rest, "chunks/"):
		if isChunkName(rest[len("chunks/"):]) {
			o.kind = GCChunk
		}
	case strings.HasPrefix(rest, "packs/"):
		if isPackName(rest[len("packs/"):]) {
			o.kind = GCPack
		}
	}
	return o, v, true
}

// isChunkName: <hh>/<64 hex>, the first byte repeated (chunkKey).
func isChunkName(s string) bool {
	if len(s) != 2+1+64 || s[2] != '/' || s[:2] != s[3:5] {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if i != 2 && !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// isPackName: 32 hex (packKey).
func isPackName(s string) bool {
	if len(s) != 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// young: modified after the cutoff, or of unknown age.
func (g *gcRun) young(o gcObj) bool { return o.ModTime.IsZero() || o.ModTime.After(g.cutoff) }

// markRoots marks the chains of the roots of the volumes in vols. Any
// error stops GC before anything is deleted.
func (g *gcRun) markRoots(ctx context.Context, vols map[Volume]bool) error {
	for v := range vols {
		vi := g.vols[v]
		var roots []GenRef
		deleted := false
		if vi.tomb != nil {
			var err error
			if deleted, err = g.r.deleted(ctx, v); err != nil {
				return fmt.Errorf("gc: %w", err)
			}
		}
		if !deleted {
			if n := len(vi.heads); n > 0 {
				h, err := g.r.readHead(ctx, v, vi.heads[n-1].seq)
				if err != nil {
					return fmt.Errorf("gc: %w", err)
				}
				roots = append(roots, GenRef{Volume: v, Generation: h.Generation})
			}
			for _, o := range vi.snaps {
				s, err := g.r.readSnapshot(ctx, v, o.name)
				if errors.Is(err, ErrNotFound) {
					continue // deleted since the listing: no root any more
				}
				if err != nil {
					return fmt.Errorf("gc: %w", err)
				}
				roots = append(roots, GenRef{Volume: v, Generation: s.Generation})
			}
		}
		for _, o := range vi.gens {
			if (v.Kind == KindTemplate && !deleted) || g.young(o) {
				roots = append(roots, GenRef{Volume: v, Generation: o.seq})
			}
		}
		for _, ref := range roots {
			if err := g.mark(ctx, ref); err != nil {
				return err
			}
		}
	}
	return nil
}

// mark marks ref's manifest chain: manifests, data chunks, keys.
func (g *gcRun) mark(ctx context.Context, ref GenRef) error {
	for depth := 0; !g.walked[ref]; depth++ {
		if depth > MaxChain {
			return fmt.Errorf("gc: mark %s: %w: parent chain longer than %d", ref, ErrInvalidManifest, MaxChain)
		}
		g.walked[ref] = true
		m, err := g.r.Manifest(ctx, ref)
		if err != nil {
			// A root that does not open: its chunks cannot be told
			// from garbage, so nothing is deleted.
			return fmt.Errorf("gc: mark: %w", err)
		}
		g.marked[manifestKey(ref)] = true
		g.marked[keyObject(ref.Volume)] = true
		for _, e := range m.Entries {
			if e.Kind == EntryData && e.Pack == 0 {
				g.marked[chunkKey(m.Volume, e.Sum)] = true
			}
		}
		// A pack is kept whole while a marked manifest lists it.
		for _, p := range m.Packs {
			g.marked[packKey(m.Volume, p)] = true
		}
		if m.Parent == nil {
			return nil
		}
		ref = *m.Parent
	}
	return nil
}

// sweep deletes, in this order, and for this reason:
//
//  1. superseded heads, and the heads and snapshots of deleted volumes:
//     bookkeeping no object depends on;
//  2. unreachable manifests, children before parents;
//  3. unreachable chunks and packs (a pack no marked manifest lists);
//  4. the tombstone, then the key, of each volume with nothing left.
//
// An existing manifest is a promise that its chain and chunks exist:
// Publish, PutSnapshot and Fork accept any generation whose chain opens,
// and a commit's manifest is the last object it writes for that reason.
// Deleting a manifest before the chunks it lists, and a child manifest
// before its parent, keeps that promise true after every single delete,
// so a GC stopped anywhere (crash, error) leaves no manifest naming a
// missing object, only unreferenced ones the next GC frees. A key goes
// last: while anything of its volume is left, reading or verifying it
// needs the key. And only unmarked objects are ever deleted, all marked
// before the first delete, so no stop point can touch a root's data.
func (g *gcRun) sweep(ctx context.Context, dryRun bool, rep GCReport) (GCReport, error) {
	var del [4][]gcObj
	old := func(o gcObj) bool { return !g.young(o) }
	for _, vi := range g.vols {
		deleted := false
		if vi.tomb != nil {
			var err error
			if deleted, err = g.r.deleted(ctx, vi.v); err != nil {
				return rep, fmt.Errorf("gc: %w", err)
			}
		}
		left := len(vi.other) // objects of the volume that stay
		keep := func(o gcObj) { rep.Kept[o.kind]++; left++ }
		for i, o := range vi.heads {
			if (deleted || i < len(vi.heads)-1) && old(o) {
				del[0] = append(del[0], o)
			} else {
				keep(o)
			}
		}
		for _, o := range vi.snaps {
			if deleted && old(o) {
				del[0] = append(del[0], o)
			} else {
				keep(o)
			}
		}
		for _, o := range vi.gens {
			if !g.marked[o.Key] && old(o) {
				del[1] = append(del[1], o)
			} else {
				keep(o)
			}
		}
		for _, o := range vi.chunks {
			if !g.marked[o.Key] && old(o) {
				del[2] = append(del[2], o)
			} else {
				keep(o)
			}
		}
		tombGoes := false
		if t := vi.tomb; t != nil {
			if left == 0 && old(*t) {
				del[3] = append(del[3], *t)
				tombGoes = true
			} else {
				keep(*t)
			}
		}
		if k := vi.key; k != nil {
			if left == 0 && !g.marked[k.Key] && (vi.tomb == nil || tombGoes) && old(*k) {
				del[3] = append(del[3], *k)
			} else {
				keep(*k)
			}
		}
		for _, o := range vi.other {
			rep.Kept[o.kind]++
		}
	}
	for _, o := range g.other {
		rep.Kept[o.kind]++
	}
	var err error
	if del[1], err = g.childrenFirst(ctx, del[1]); err != nil {
		return rep, err
	}
	for _, phase := range del {
		for _, o := range phase {
			if dryRun {
				rep.DeletedKeys = append(rep.DeletedKeys, o.Key)
			} else if err := g.r.store.Delete(ctx, o.Key); err != nil {
				return rep, fmt.Errorf("gc: %w", err)
			}
			rep.Deleted[o.kind]++
			rep.BytesFreed += o.Size
		}
	}
	return rep, nil
}

// childrenFirst orders the unreachable manifests so that each comes
// before its parent (when that goes too). One that does not open names no
// parent we can read; it goes first (after its own children).
func (g *gcRun) childrenFirst(ctx context.Context, gens []gcObj) ([]gcObj, error) {
	byKey := map[string]gcObj{}
	for _, o := range gens {
		byKey[o.Key] = o
	}
	children := map[string][]string{}
	var broken, roots []string
	for _, o := range gens {
		v, _ := ParseVolume(strings.Join(strings.SplitN(o.Key, "/", 3)[:2], "/"))
		m, err := g.r.Manifest(ctx, GenRef{Volume: v, Generation: o.seq})
		switch {
		case errors.Is(err, ErrNotFound) || errors.Is(err, ErrCorrupt) || errors.Is(err, ErrInvalidManifest):
			broken = append(broken, o.Key)
			continue
		case err != nil:
			return nil, fmt.Errorf("gc: %w", err)
		}
		if m.Parent != nil {
			if pk := manifestKey(*m.Parent); byKey[pk].Key != "" {
				children[pk] = append(children[pk], o.Key)
				continue
			}
		}
		roots = append(roots, o.Key)
	}
	out := make([]gcObj, 0, len(gens))
	done := map[string]bool{}
	var visit func(k string)
	visit = func(k string) {
		if done[k] {
			return
		}
		done[k] = true
		for _, c := range children[k] {
			visit(c)
		}
		out = append(out, byKey[k])
	}
	for _, k := range broken {
		visit(k)
	}
	// Every manifest is reached from the parentless end of its chain
	// (among those going) or, in a loop, from the leftovers below.
	for _, k := range roots {
		visit(k)
	}
	for _, o := range gens {
		visit(o.Key)
	}
	return out, nil
}
