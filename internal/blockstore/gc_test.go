package blockstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/blockstore"
)

// gcScene builds a store with every kind of root and of garbage, and
// returns the roots with the bytes they read as:
//
//   - template base@0, base@1 (templates are roots);
//   - sb-a: a fork of base@1, generations 1 and 2 over it, heads at 0,
//     1, 2 (the head is 2), snapshot "snap" of 1, and the chunk of an
//     aborted seal (garbage);
//   - sb-b: a fork of sb-a@2 with a generation 1 of its own, published,
//     then deleted (garbage but for what sb-a shares);
//   - sb-c: a fork of sb-a@1, head at 0, an unpublished generation 1
//     (garbage);
//   - template gone@0, deleted (all garbage, its key and tombstone too).
func gcScene(t *testing.T, r *blockstore.Repo) (roots map[blockstore.GenRef][]byte, extra []string) {
	t.Helper()
	ctx := context.Background()
	ref := func(v blockstore.Volume, g uint64) blockstore.GenRef {
		return blockstore.GenRef{Volume: v, Generation: g}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	publish := func(v blockstore.Volume, expect blockstore.Head, g uint64) blockstore.Head {
		t.Helper()
		h, err := r.Publish(ctx, v, expect, blockstore.Head{Generation: g, WriterEpoch: 1, Node: "node-a"})
		must(err)
		return h
	}
	base, a, b, c, gone := blockstore.Template("base"), blockstore.Sandbox("sb-a"), blockstore.Sandbox("sb-b"), blockstore.Sandbox("sb-c"), blockstore.Template("gone")
	t0, t1 := ref(base, 0), ref(base, 1)
	commitRandom(t, r, t0, nil, 6)
	commitRandom(t, r, t1, &t0, 2)

	_, err := r.Fork(ctx, t1, a)
	must(err)
	a0, a1, a2 := ref(a, 0), ref(a, 1), ref(a, 2)
	h := publish(a, blockstore.Head{}, 0)
	commitRandom(t, r, a1, &a0, 3)
	h = publish(a, h, 1)
	commitRandom(t, r, a2, &a1, 2)
	publish(a, h, 2)
	must(r.PutSnapshot(ctx, a, "snap", 1))
	w, err := r.NewWriter(ctx, blockstore.CommitSpec{Generation: ref(a, 3), Parent: &a2, DeviceSize: 8 * cs})
	must(err)
	must(w.WriteChunk(ctx, 5, randChunk(t)))
	w.Abort()

	_, err = r.Fork(ctx, a2, b)
	must(err)
	b0 := ref(b, 0)
	commitRandom(t, r, ref(b, 1), &b0, 4)
	publish(b, blockstore.Head{}, 1)
	must(r.DeleteVolume(ctx, b))

	_, err = r.Fork(ctx, a1, c)
	must(err)
	c0 := ref(c, 0)
	publish(c, blockstore.Head{}, 0)
	commitRandom(t, r, ref(c, 1), &c0, 3)

	commitRandom(t, r, ref(gone, 0), nil, 2)
	must(r.DeleteVolume(ctx, gone))

	roots = map[blockstore.GenRef][]byte{}
	for _, g := range []blockstore.GenRef{t0, t1, a1, a2, c0} {
		roots[g] = readAll(t, r, g)
	}
	extra = []string{
		"sandboxes/sb-a/head/00000000000000000003",
		"sandboxes/sb-a/snap/snap",
		"sandboxes/sb-c/head/00000000000000000001",
	}
	return roots, extra
}

// reachableKeys is what a full GC must leave: the manifests, chunks and
// keys of the roots' chains, and extra (heads, snapshots), sorted.
func reachableKeys(t *testing.T, r *blockstore.Repo, roots map[blockstore.GenRef][]byte, extra []string) []string {
	t.Helper()
	ctx := context.Background()
	keep := map[string]bool{}
	for _, k := range extra {
		keep[k] = true
	}
	for root := range roots {
		im, err := r.Open(ctx, root)
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range im.Chain() {
			m, err := r.Manifest(ctx, g)
			if err != nil {
				t.Fatal(err)
			}
			keep[fmt.Sprintf("%s/gen/%020d", g.Volume, g.Generation)] = true
			keep[g.Volume.String()+"/key"] = true
			for _, e := range m.Entries {
				if e.Kind == blockstore.EntryData {
					keep[fmt.Sprintf("%s/chunks/%02x/%x", g.Volume, e.Sum[0], e.Sum)] = true
				}
			}
		}
	}
	out := make([]string, 0, len(keep))
	for k := range keep {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// checkRoots reads every root whole and compares it with its bytes.
func checkRoots(t *testing.T, r *blockstore.Repo, roots map[blockstore.GenRef][]byte) {
	t.Helper()
	for g, want := range roots {
		if !bytes.Equal(readAll(t, r, g), want) {
			t.Fatalf("root %s reads differently after GC", g)
		}
	}
}

// checkManifestsWhole opens every manifest left in the store and reads
// all its chunks: an existing manifest is never missing a part.
func checkManifestsWhole(t *testing.T, st blockstore.Store, r *blockstore.Repo) {
	t.Helper()
	keys, err := st.List(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		parts := strings.Split(k, "/")
		if len(parts) != 4 || parts[2] != "gen" {
			continue
		}
		g, err := strconv.ParseUint(parts[3], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, r, blockstore.GenRef{Volume: blockstore.Volume{Kind: blockstore.VolumeKind(parts[0]), ID: parts[1]}, Generation: g})
	}
}

func listAll(t *testing.T, st blockstore.Store) []string {
	t.Helper()
	keys, err := st.List(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// later is a GC clock two hours ahead: with an hour's grace every object
// of the test is old.
func later() time.Time { return time.Now().Add(2 * time.Hour) }

// A GC after forks, deletes, superseded heads and an aborted seal leaves
// exactly the reachable objects (every root reads byte-identical) and
// frees all the rest, keys and tombstones of emptied volumes included; a
// dry run before it reports the same deletions and deletes nothing, and a
// second GC finds nothing to do.
func TestGCKeepsReachableFreesTheRest(t *testing.T) {
	onBackends(t, nil, func(t *testing.T, st blockstore.Store, r *blockstore.Repo) {
		ctx := context.Background()
		roots, extra := gcScene(t, r)
		want := reachableKeys(t, r, roots, extra)
		before := listAll(t, st)
		opts := blockstore.GCOptions{Grace: time.Hour, Now: later, DryRun: true}
		dry, err := r.GC(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		if got := listAll(t, st); !reflect.DeepEqual(got, before) {
			t.Fatalf("a dry run changed the store:\n%q\n%q", before, got)
		}
		opts.DryRun = false
		rep, err := r.GC(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		after := listAll(t, st)
		if !reflect.DeepEqual(after, want) {
			t.Fatalf("after GC the store has\n%q\nwant exactly\n%q", after, want)
		}
		checkRoots(t, r, roots)
		var gone []string
		for _, k := range before {
			if !slices.Contains(after, k) {
				gone = append(gone, k)
			}
		}
		got := slices.Clone(dry.DeletedKeys)
		sort.Strings(got)
		if !reflect.DeepEqual(got, gone) {
			t.Fatalf("dry run would delete\n%q\nGC deleted\n%q", got, gone)
		}
		if !reflect.DeepEqual(dry.Deleted, rep.Deleted) || dry.BytesFreed != rep.BytesFreed || rep.BytesFreed <= 0 {
			t.Fatalf("dry run report %+v, GC report %+v", dry, rep)
		}
		if rep.DeletedKeys != nil {
			t.Fatalf("GC (not dry) listed keys %q", rep.DeletedKeys)
		}
		// sb-b: 2 manifests, its own chunks (4), 2 heads (DeleteVolume
		// took them already: 0 here), key, tombstone; sb-c: 1 manifest,
		// 3 chunks; sb-a: 2 superseded heads, 1 aborted chunk; gone: 1
		// manifest, 2 chunks, key, tombstone.
		wantDel := map[string]int{blockstore.GCManifest: 4, blockstore.GCChunk: 10, blockstore.GCHead: 2, blockstore.GCKey: 2, blockstore.GCTombstone: 2}
		if _, ok := st.(blockstore.Batcher); ok {
			wantDel[blockstore.GCChunk] = 9 // the abort took its staged chunk
		}
		if !reflect.DeepEqual(rep.Deleted, wantDel) {
			t.Errorf("GC deleted %v, want %v", rep.Deleted, wantDel)
		}
		kept := 0
		for _, n := range rep.Kept {
			kept += n
		}
		if kept != len(want) {
			t.Errorf("GC kept %v (%d objects), the store has %d", rep.Kept, kept, len(want))
		}
		again, err := r.GC(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		if len(again.Deleted) != 0 || !reflect.DeepEqual(listAll(t, st), want) {
			t.Fatalf("a second GC deleted %v", again.Deleted)
		}
	})
}

// Objects younger than the grace stay: a generation committed just now
// and not yet published, a fork not yet published, the chunks of a seal
// in flight, a superseded head published just now. Once old, they go.
func TestGCGraceKeepsYoung(t *testing.T) {
	onBackends(t, nil, func(t *testing.T, st blockstore.Store, r *blockstore.Repo) {
		ctx := context.Background()
		v := blockstore.Sandbox("sb-1")
		g0 := blockstore.GenRef{Volume: v, Generation: 0}
		commitRandom(t, r, g0, nil, 2)
		h, err := r.Publish(ctx, v, blockstore.Head{}, blockstore.Head{})
		if err != nil {
			t.Fatal(err)
		}
		g1 := blockstore.GenRef{Volume: v, Generation: 1}
		commitRandom(t, r, g1, &g0, 3)
		if _, err := r.Publish(ctx, v, h, blockstore.Head{Generation: 1}); err != nil {
			t.Fatal(err)
		}
		g2 := blockstore.GenRef{Volume: v, Generation: 2}
		unpublished := commitRandom(t, r, g2, &g1, 1)
		if _, err := r.Fork(ctx, g2, blockstore.Sandbox("sb-fork")); err != nil {
			t.Fatal(err)
		}
		w, err := r.NewWriter(ctx, blockstore.CommitSpec{Generation: blockstore.GenRef{Volume: v, Generation: 3}, Parent: &g2, DeviceSize: 8 * cs})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.WriteChunk(ctx, 4, randChunk(t)); err != nil {
			t.Fatal(err)
		}
		w.Abort()
		before := listAll(t, st)
		rep, err := r.GC(ctx, blockstore.GCOptions{Grace: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Deleted) != 0 || !reflect.DeepEqual(listAll(t, st), before) {
			t.Fatalf("GC within the grace deleted %v", rep.Deleted)
		}
		want := bytes.Clone(readAll(t, r, g1))
		copy(want, unpublished[0])
		if !bytes.Equal(readAll(t, r, g2), want) {
			t.Fatal("the young generation reads wrong")
		}
		rep, err = r.GC(ctx, blockstore.GCOptions{Grace: time.Hour, Now: later})
		if err != nil {
			t.Fatal(err)
		}
		// g2 (1 chunk) and the fork's manifest, key and all; the aborted
		// chunk (a Batcher's abort took it already); head 1.
		wantDel := map[string]int{blockstore.GCManifest: 2, blockstore.GCChunk: 2, blockstore.GCHead: 1, blockstore.GCKey: 1}
		if _, ok := st.(blockstore.Batcher); ok {
			wantDel[blockstore.GCChunk] = 1
		}
		if !reflect.DeepEqual(rep.Deleted, wantDel) {
			t.Fatalf("GC once old deleted %v, want %v", rep.Deleted, wantDel)
		}
		readAll(t, r, g1)
	})
}

// crashStore fails every Delete once its budget of deletes is spent: a
// GC that dies part way through its sweep.
type crashStore struct {
	blockstore.Store
	budget atomic.Int64
}

func (s *crashStore) Delete(ctx context.Context, key string) error {
	if s.budget.Add(-1) < 0 {
		return errors.New("injected: crashed")
	}
	return s.Store.Delete(ctx, key)
}

func (s *crashStore) ListInfo(ctx context.Context, prefix string) ([]blockstore.ObjectInfo, error) {
	return s.Store.(blockstore.Lister).ListInfo(ctx, prefix)
}

// A GC that crashes after any number of deletes leaves every root
// readable byte-identical and every manifest left in the store whole
// (its chain and chunks all there); GCs run again, each crashing a few
// deletes later, end with exactly the reachable objects.
func TestGCCrashMidSweep(t *testing.T) {
	var cs *crashStore
	onBackends(t, func(st blockstore.Store) blockstore.Store {
		cs = &crashStore{Store: st}
		cs.budget.Store(1 << 40)
		return cs
	}, func(t *testing.T, st blockstore.Store, r *blockstore.Repo) {
		ctx := context.Background()
		roots, extra := gcScene(t, r)
		want := reachableKeys(t, r, roots, extra)
		opts := blockstore.GCOptions{Grace: time.Hour, Now: later}
		for run := 0; ; run++ {
			if run > 30 {
				t.Fatal("GC never completed")
			}
			cs.budget.Store(int64(run))
			_, err := r.GC(ctx, opts)
			cs.budget.Store(1 << 40)
			checkRoots(t, r, roots)
			checkManifestsWhole(t, st, r)
			if err == nil {
				break
			}
			if !strings.Contains(err.Error(), "injected") {
				t.Fatalf("run %d: %v", run, err)
			}
		}
		if got := listAll(t, st); !reflect.DeepEqual(got, want) {
			t.Fatalf("after the GCs the store has\n%q\nwant\n%q", got, want)
		}
	})
}

// A GC refuses what it cannot do safely: a store without modification
// times, a grace that is not positive; and a root it cannot read (a
// tampered head) stops it before any delete.
func TestGCRefuses(t *testing.T) {
	onBackends(t, nil, func(t *testing.T, st blockstore.Store, r *blockstore.Repo) {
		ctx := context.Background()
		nk, _, err := blockstore.GenerateNodeKey("node-a")
		if err != nil {
			t.Fatal(err)
		}
		plain, err := blockstore.New(struct{ blockstore.Store }{st}, nk, blockstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := plain.GC(ctx, blockstore.GCOptions{Grace: time.Hour}); err == nil {
			t.Error("GC over a store without ListInfo succeeded")
		}
		if _, err := r.GC(ctx, blockstore.GCOptions{}); err == nil {
			t.Error("GC without a grace succeeded")
		}
		gcScene(t, r)
		tamper(t, st, "sandboxes/sb-a/head/00000000000000000003")
		before := listAll(t, st)
		if _, err := r.GC(ctx, blockstore.GCOptions{Grace: time.Hour, Now: later}); !errors.Is(err, blockstore.ErrCorrupt) {
			t.Fatalf("GC with a tampered head = %v, want ErrCorrupt", err)
		}
		if got := listAll(t, st); !reflect.DeepEqual(got, before) {
			t.Fatal("a GC that failed its mark deleted objects")
		}
	})
}

// A manifest younger than the grace is a root with its whole chain: a
// fork made just now of a generation nothing else keeps (old, no head)
// keeps that generation and its chunks, and reads as it did.
func TestGCYoungManifestKeepsItsChain(t *testing.T) {
	onBackends(t, nil, func(t *testing.T, st blockstore.Store, r *blockstore.Repo) {
		ctx := context.Background()
		src := blockstore.GenRef{Volume: blockstore.Sandbox("sb-old"), Generation: 0}
		commitRandom(t, r, src, nil, 3)
		// S3 keeps whole seconds: 3 s make src old against a 2 s grace,
		// and what is written next young.
		time.Sleep(3 * time.Second)
		dst := blockstore.GenRef{Volume: blockstore.Sandbox("sb-new"), Generation: 0}
		if _, err := r.Fork(ctx, src, dst.Volume); err != nil {
			t.Fatal(err)
		}
		want := readAll(t, r, src)
		rep, err := r.GC(ctx, blockstore.GCOptions{Grace: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Deleted) != 0 {
			t.Fatalf("GC deleted %v; the young fork reaches everything", rep.Deleted)
		}
		if !bytes.Equal(readAll(t, r, dst), want) {
			t.Fatal("the fork reads differently after GC")
		}
	})
}

// A deleted template that a live sandbox was forked from keeps what the
// sandbox reads (manifest, chunks, key, tombstone); once the sandbox is
// deleted too, GC empties the store.
func TestGCDeletedParentKeptForItsFork(t *testing.T) {
	onBackends(t, nil, func(t *testing.T, st blockstore.Store, r *blockstore.Repo) {
		ctx := context.Background()
		tpl := blockstore.GenRef{Volume: blockstore.Template("base"), Generation: 0}
		commitRandom(t, r, tpl, nil, 4)
		sb := blockstore.Sandbox("sb-1")
		if _, err := r.Fork(ctx, tpl, sb); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Publish(ctx, sb, blockstore.Head{}, blockstore.Head{}); err != nil {
			t.Fatal(err)
		}
		want := readAll(t, r, tpl)
		if err := r.DeleteVolume(ctx, tpl.Volume); err != nil {
			t.Fatal(err)
		}
		before := listAll(t, st)
		opts := blockstore.GCOptions{Grace: time.Hour, Now: later}
		if rep, err := r.GC(ctx, opts); err != nil || len(rep.Deleted) != 0 {
			t.Fatalf("GC = %v, %v; the fork reaches everything", rep.Deleted, err)
		}
		if !reflect.DeepEqual(listAll(t, st), before) {
			t.Fatal("GC changed the store")
		}
		if !bytes.Equal(readAll(t, r, blockstore.GenRef{Volume: sb}), want) {
			t.Fatal("the fork reads differently")
		}
		if err := r.DeleteVolume(ctx, sb); err != nil {
			t.Fatal(err)
		}
		if _, err := r.GC(ctx, opts); err != nil {
			t.Fatal(err)
		}
		if left := listAll(t, st); len(left) != 0 {
			t.Fatalf("after both volumes are deleted GC left %q", left)
		}
	})
}
