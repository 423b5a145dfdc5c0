package dirstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/ctld/ctld/internal/blockstore"
)

// fsOp is one recorded file system call of the store.
type fsOp struct {
	kind   string // write, link, mkdir, syncdir, syncfs, remove
	tmp    string // write, link, remove
	path   string // link: the object's name; mkdir, syncdir: the directory
	data   []byte // write
	synced bool   // write: fsynced before it returned
}

// recOps performs the real calls and records each that succeeded, in
// order, so a test can replay what a crash after any of them leaves.
type recOps struct {
	osOps
	mu  sync.Mutex
	log []fsOp
	// appended are the temp files of packs (createTemp): their data is
	// recorded as one unsynced write when they are synced (a crash
	// before leaves them with no data on the disk).
	appended map[string]bool
}

func (r *recOps) createTemp(dir, base string) (*os.File, error) {
	f, err := r.osOps.createTemp(dir, base)
	if err == nil {
		r.mu.Lock()
		if r.appended == nil {
			r.appended = map[string]bool{}
		}
		r.appended[f.Name()] = true
		r.mu.Unlock()
	}
	return f, err
}

func (r *recOps) add(op fsOp) {
	r.mu.Lock()
	r.log = append(r.log, op)
	r.mu.Unlock()
}

func (r *recOps) writeTemp(dir, base string, data []byte, sync bool) (string, error) {
	tmp, err := r.osOps.writeTemp(dir, base, data, sync)
	if err == nil {
		r.add(fsOp{kind: "write", tmp: tmp, data: bytes.Clone(data), synced: sync})
	}
	return tmp, err
}

func (r *recOps) link(tmp, path string) error {
	err := r.osOps.link(tmp, path)
	if err == nil {
		r.add(fsOp{kind: "link", tmp: tmp, path: path})
	}
	return err
}

func (r *recOps) remove(p string) error {
	err := r.osOps.remove(p)
	if err == nil {
		r.add(fsOp{kind: "remove", tmp: p})
	}
	return err
}

func (r *recOps) mkdir(dir string) error {
	err := r.osOps.mkdir(dir)
	if err == nil {
		r.add(fsOp{kind: "mkdir", path: dir})
	}
	return err
}

func (r *recOps) syncDir(dir string) error {
	err := r.osOps.syncDir(dir)
	if err == nil {
		r.add(fsOp{kind: "syncdir", path: dir})
	}
	return err
}

func (r *recOps) syncFile(p string) error {
	r.mu.Lock()
	appended := r.appended[p]
	r.mu.Unlock()
	if appended {
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		r.add(fsOp{kind: "write", tmp: p, data: data})
	}
	err := r.osOps.syncFile(p)
	if err == nil {
		r.add(fsOp{kind: "syncfile", tmp: p})
	}
	return err
}

func (r *recOps) syncFS(root string) error {
	err := r.osOps.syncFS(root)
	if err == nil {
		r.add(fsOp{kind: "syncfs"})
	}
	return err
}

// crashAfter is what a crash after the first k ops leaves, seen two ways,
// both pessimistic: names are every name linked (a file system may write
// any metadata out early, e.g. ext4's journal timer), each with the data
// that was synced (nil: none reached the disk); durable are the names
// that a sync covered (a file system need not keep any other), in link
// order: a name in a directory the log created is durable only once that
// directory's own entry is, by a sync of its parent after the mkdir (and
// so on up).
func crashAfter(log []fsOp, k int) (names map[string][]byte, durable []string) {
	data := map[string][]byte{} // temp file (the inode) → synced data
	written := map[string][]byte{}
	linkOf := map[string]string{} // name → temp file
	var order []string            // names in link order
	isDurable := map[string]bool{}
	var dirs []string // directories made, in order
	created, dirDurable := map[string]bool{}, map[string]bool{}
	for _, op := range log[:k] {
		switch op.kind {
		case "write":
			written[op.tmp] = op.data
			if op.synced {
				data[op.tmp] = op.data
			}
		case "syncfile":
			data[op.tmp] = written[op.tmp]
		case "link":
			linkOf[op.path] = op.tmp
			order = append(order, op.path)
		case "mkdir":
			created[op.path] = true
			dirs = append(dirs, op.path)
		case "syncdir":
			for _, n := range order {
				if filepath.Dir(n) == op.path {
					isDurable[n] = true
				}
			}
			for _, d := range dirs {
				if filepath.Dir(d) == op.path {
					dirDurable[d] = true
				}
			}
		case "syncfs":
			for t, d := range written {
				data[t] = d
			}
			for _, n := range order {
				isDurable[n] = true
			}
			for _, d := range dirs {
				dirDurable[d] = true
			}
		}
	}
	pathDurable := func(n string) bool {
		for d := filepath.Dir(n); d != filepath.Dir(d); d = filepath.Dir(d) {
			if created[d] && !dirDurable[d] {
				return false
			}
		}
		return true
	}
	names = map[string][]byte{}
	for n, t := range linkOf {
		names[n] = data[t]
	}
	for _, n := range order {
		if isDurable[n] && pathDurable(n) {
			durable = append(durable, n)
		}
	}
	return names, durable
}

// TestCommitCrashSafe: a generation's chunks are written through one
// batch (one syncfs for the commit, not two fsyncs per chunk); a crash
// after any of the store's file system calls of two commits and a head
// publish leaves (1) no visible object with data that did not reach the
// disk, and (2) a manifest or head that survived only with every object
// written before it surviving whole: the head a restart reads is the old
// one or the new one, each with all its chunks.
func TestCommitCrashSafe(t *testing.T) {
	for _, perFile := range []bool{false, true} {
		t.Run(map[bool]string{false: "syncfs", true: "per-file"}[perFile], func(t *testing.T) { testCommitCrashSafe(t, perFile) })
	}
}

func testCommitCrashSafe(t *testing.T, perFile bool) {
	ctx := context.Background()
	s, err := Open(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	rec := &recOps{}
	s.ops, s.syncFS = rec, !perFile
	nk, _, err := blockstore.GenerateNodeKey("node-a")
	if err != nil {
		t.Fatal(err)
	}
	repo, err := blockstore.New(s, nk, blockstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	vol := blockstore.Sandbox("sb1")
	chunks := func(seed byte, n int) map[uint64][]byte {
		out := map[uint64][]byte{}
		for i := range n {
			c := bytes.Repeat([]byte{seed, byte(i), 0xa5}, blockstore.DefaultChunkSize/3+1)[:blockstore.DefaultChunkSize]
			out[uint64(i*2)] = c
		}
		return out
	}
	g0 := blockstore.GenRef{Volume: vol}
	if _, err := repo.Commit(ctx, blockstore.CommitSpec{Generation: g0, DeviceSize: 64 * blockstore.DefaultChunkSize}, chunks(1, 12)); err != nil {
		t.Fatal(err)
	}
	h0, err := repo.Publish(ctx, vol, blockstore.Head{}, blockstore.Head{Generation: 0})
	if err != nil {
		t.Fatal(err)
	}
	g1 := blockstore.GenRef{Volume: vol, Generation: 1}
	if _, err := repo.Commit(ctx, blockstore.CommitSpec{Generation: g1, Parent: &g0, DeviceSize: 64 * blockstore.DefaultChunkSize}, chunks(2, 9)); err != nil {
		t.Fatal(err)
	}
	if _, err := repo.Publish(ctx, vol, h0, blockstore.Head{Generation: 1}); err != nil {
		t.Fatal(err)
	}

	log := rec.log
	syncs, files, writes := 0, 0, 0
	for _, op := range log {
		switch op.kind {
		case "syncfs":
			syncs++
		case "syncfile":
			files++
		case "write":
			if !op.synced {
				writes++
			}
		}
	}
	// 21 chunks written unsynced; each commit's batch syncs the file
	// system twice (data, then names), or each file once.
	if want := map[bool][2]int{false: {4, 0}, true: {0, 21}}[perFile]; writes != 21 || syncs != want[0] || files != want[1] {
		t.Errorf("%d unsynced writes, %d syncfs, %d file fsyncs; want 21, %d, %d", writes, syncs, files, want[0], want[1])
	}
	checkCrashPoints(t, s, log)
}

// checkCrashPoints replays a crash after every op of log: (1) no visible
// object with data that did not reach the disk, (2) no durable manifest
// or head without every object written before it durable.
func checkCrashPoints(t *testing.T, s *Store, log []fsOp) {
	t.Helper()
	rel := func(p string) string { r, _ := filepath.Rel(s.Root(), p); return r }
	for k := 0; k <= len(log); k++ {
		names, durable := crashAfter(log, k)
		for n, d := range names {
			if d == nil {
				t.Fatalf("crash after op %d (%s): %s is visible but its data never reached the disk", k, opString(log, k), rel(n))
			}
		}
		for _, n := range durable {
			if !strings.Contains(n, "/gen/") && !strings.Contains(n, "/head/") {
				continue
			}
			for _, o := range writtenBefore(log, n) {
				if !slices.Contains(durable, o) {
					t.Fatalf("crash after op %d (%s): %s survives but %s, written before it, need not", k, opString(log, k), rel(n), rel(o))
				}
			}
		}
	}
	t.Logf("%d file system calls, every crash point checked", len(log))
}

// writtenBefore lists the objects (by the name each temp file got in
// the whole log) written before name's own temp file: what a commit
// point (a manifest, a head) must not survive without.
func writtenBefore(log []fsOp, name string) []string {
	final := map[string]string{}
	for _, op := range log {
		if op.kind == "link" {
			final[op.tmp] = op.path
		}
	}
	var out []string
	for _, op := range log {
		if op.kind != "write" {
			continue
		}
		if final[op.tmp] == name {
			return out
		}
		if f := final[op.tmp]; f != "" {
			out = append(out, f)
		}
	}
	return out
}

func opString(log []fsOp, k int) string {
	if k == 0 {
		return "none"
	}
	op := log[k-1]
	return fmt.Sprintf("%s %s%s", op.kind, filepath.Base(op.tmp), filepath.Base(op.path))
}

// TestBatchVisibility: a staged object is invisible (Get, List) until the
// batch commits; a commit over an existing key keeps the stored object;
// an abort leaves no file, not even a hidden temp file.
func TestBatchVisibility(t *testing.T) {
	ctx := context.Background()
	s, err := Open(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, "v/chunks/aa/old", []byte("stored")); err != nil {
		t.Fatal(err)
	}
	b := s.NewBatch()
	for _, k := range []string{"v/chunks/aa/new", "v/chunks/aa/old"} {
		if err := b.Put(ctx, k, []byte("batch")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Get(ctx, "v/chunks/aa/new"); !errors.Is(err, blockstore.ErrNotFound) {
		t.Fatalf("Get of a staged object: %v", err)
	}
	if keys, err := s.List(ctx, ""); err != nil || len(keys) != 1 {
		t.Fatalf("List with a batch staged = %q, %v", keys, err)
	}
	if err := b.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{"v/chunks/aa/new": "batch", "v/chunks/aa/old": "stored"} {
		if got, err := s.Get(ctx, k); err != nil || string(got) != want {
			t.Errorf("%s = %q, %v; want %q", k, got, err, want)
		}
	}
	if err := b.Put(ctx, "v/chunks/aa/late", nil); err == nil {
		t.Error("Put after Commit succeeded")
	}
	a := s.NewBatch()
	if err := a.Put(ctx, "v/chunks/bb/aborted", []byte("x")); err != nil {
		t.Fatal(err)
	}
	a.Abort()
	var files []string
	filepath.WalkDir(s.Root(), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files = append(files, strings.TrimPrefix(p, s.Root()))
		}
		return err
	})
	if len(files) != 2 {
		t.Errorf("files after commit and abort: %q, want the two objects", files)
	}
}
