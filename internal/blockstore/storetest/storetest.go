// Package storetest is the contract every blockstore.Store passes: the
// directory backend and the S3 backend (against a real server) run the same
// cases, so code above the Store cannot tell them apart.
package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/blockstore"
)

// Run runs the contract against stores from newStore; each case gets a
// fresh, empty store.
func Run(t *testing.T, newStore func(t *testing.T) blockstore.Store) {
	type contractCase struct {
		name string
		fn   func(t *testing.T, s blockstore.Store)
	}
	cases := []contractCase{
		{"PutGet", testPutGet},
		{"GetMissing", testGetMissing},
		{"PutExistingKeepsFirst", testPutExisting},
		{"Delete", testDelete},
		{"List", testList},
		{"InvalidKeys", testInvalidKeys},
		{"ConcurrentPutOneWins", testConcurrentPut},
		{"NoPartialObjectVisible", testNoPartial},
		{"CancelledContext", testCancelled},
		{"PutCopiesData", testPutCopies},
		{"ListInfoAgreesWithList", testListInfo},
	}
	// GetBuffer is optional: its case is in the contract of a store that
	// offers it (not a skip for one that does not: the unit stage fails
	// on skips).
	if _, ok := newStore(t).(blockstore.BufferGetter); ok {
		cases = append(cases, contractCase{"GetBufferAgreesWithGet", testGetBuffer})
	}
	if _, ok := newStore(t).(blockstore.RangeGetter); ok {
		cases = append(cases, contractCase{"GetRangeReadsExactly", testGetRange})
	}
	if _, ok := newStore(t).(blockstore.Packer); ok {
		cases = append(cases, contractCase{"PackVisibleOnlyAfterCommit", testPack})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.fn(t, newStore(t))
		})
	}
}

func random(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func mustPut(t *testing.T, s blockstore.Store, key string, data []byte) {
	t.Helper()
	if err := s.Put(context.Background(), key, data); err != nil {
		t.Fatalf("Put(%q): %v", key, err)
	}
}

func mustGet(t *testing.T, s blockstore.Store, key string) []byte {
	t.Helper()
	b, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	return b
}

func testPutGet(t *testing.T, s blockstore.Store) {
	for _, c := range []struct {
		key  string
		size int
	}{
		{"empty", 0},
		{"one", 1},
		{"sb-1/chunks/ab12", 64 << 10},
		{"sb-1/gen/00000000000000000001", 3<<20 + 7},
	} {
		data := random(t, c.size)
		mustPut(t, s, c.key, data)
		got := mustGet(t, s, c.key)
		if !bytes.Equal(got, data) {
			t.Fatalf("Get(%q) returned %d bytes, want the %d put", c.key, len(got), len(data))
		}
	}
}

func testGetMissing(t *testing.T, s blockstore.Store) {
	mustPut(t, s, "a/b", []byte("x"))
	for _, key := range []string{"missing", "a/c", "a/b/c", "a"} {
		b, err := s.Get(context.Background(), key)
		if !errors.Is(err, blockstore.ErrNotFound) {
			t.Errorf("Get(%q) = %d bytes, %v; want ErrNotFound", key, len(b), err)
		}
	}
}

func testPutExisting(t *testing.T, s blockstore.Store) {
	first := []byte("first")
	mustPut(t, s, "k/v", first)
	err := s.Put(context.Background(), "k/v", []byte("second, longer"))
	if !errors.Is(err, blockstore.ErrExists) {
		t.Fatalf("second Put = %v, want ErrExists", err)
	}
	if got := mustGet(t, s, "k/v"); !bytes.Equal(got, first) {
		t.Fatalf("after refused Put, Get = %q, want %q", got, first)
	}
}

func testDelete(t *testing.T, s blockstore.Store) {
	ctx := context.Background()
	mustPut(t, s, "d/one", []byte("1"))
	mustPut(t, s, "d/two", []byte("2"))
	if err := s.Delete(ctx, "d/one"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, err := s.Get(ctx, "d/one"); !errors.Is(err, blockstore.ErrNotFound) {
		t.Fatalf("Get after Delete = %v, want ErrNotFound", err)
	}
	if got := mustGet(t, s, "d/two"); string(got) != "2" {
		t.Fatalf("neighbour after Delete = %q", got)
	}
	// Teardown is idempotent: deleting what is gone is success.
	for _, key := range []string{"d/one", "never", "d/two/x"} {
		if err := s.Delete(ctx, key); err != nil {
			t.Fatalf("Delete(%q) of a missing key = %v, want nil", key, err)
		}
	}
	// A deleted key can be created again.
	mustPut(t, s, "d/one", []byte("again"))
	if got := mustGet(t, s, "d/one"); string(got) != "again" {
		t.Fatalf("re-created object = %q", got)
	}
}

func testList(t *testing.T, s blockstore.Store) {
	ctx := context.Background()
	keys := []string{
		"sb-a/gen/00000000000000000001",
		"sb-a/gen/00000000000000000002",
		"sb-a/gen/00000000000000000010",
		"sb-a/chunks/00ff",
		"sb-a/chunks/ff00",
		"sb-ab/gen/00000000000000000001",
		"top",
	}
	for _, k := range keys {
		mustPut(t, s, k, []byte(k))
	}
	for _, c := range []struct {
		prefix string
		want   []string
	}{
		{"", []string{keys[3], keys[4], keys[0], keys[1], keys[2], keys[5], keys[6]}},
		{"sb-a/", []string{keys[3], keys[4], keys[0], keys[1], keys[2]}},
		{"sb-a", []string{keys[3], keys[4], keys[0], keys[1], keys[2], keys[5]}},
		{"sb-a/gen/", keys[0:3]},
		{"sb-a/gen/0000000000000000000", keys[0:2]},
		{"sb-a/chunks/ff", keys[4:5]},
		{"to", keys[6:7]},
		{"none/", nil},
		{"sb-a/gen/00000000000000000001/", nil},
	} {
		got, err := s.List(ctx, c.prefix)
		if err != nil {
			t.Fatalf("List(%q): %v", c.prefix, err)
		}
		if len(got) == 0 && len(c.want) == 0 {
			continue
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("List(%q) =\n %q\nwant\n %q", c.prefix, got, c.want)
		}
	}
}

func testInvalidKeys(t *testing.T, s blockstore.Store) {
	ctx := context.Background()
	for _, key := range []string{"", "/a", "a/", "a//b", "..", "../x", "a/../b", ".hidden", "a/.tmp-1", "a b", "a\x00b", "a\\b", "ü", string(make([]byte, 600))} {
		if err := s.Put(ctx, key, []byte("x")); !errors.Is(err, blockstore.ErrInvalidKey) {
			t.Errorf("Put(%q) = %v, want ErrInvalidKey", key, err)
		}
		if _, err := s.Get(ctx, key); !errors.Is(err, blockstore.ErrInvalidKey) {
			t.Errorf("Get(%q) = %v, want ErrInvalidKey", key, err)
		}
		if err := s.Delete(ctx, key); !errors.Is(err, blockstore.ErrInvalidKey) {
			t.Errorf("Delete(%q) = %v, want ErrInvalidKey", key, err)
		}
	}
	for _, p := range []string{"/", "../", "a/../", ".x", "a//"} {
		if _, err := s.List(ctx, p); !errors.Is(err, blockstore.ErrInvalidKey) {
			t.Errorf("List(%q) = %v, want ErrInvalidKey", p, err)
		}
	}
	// Nothing was created by the refused calls.
	if got, err := s.List(ctx, ""); err != nil || len(got) != 0 {
		t.Fatalf("after refused calls List = %q, %v; want empty", got, err)
	}
}

func testConcurrentPut(t *testing.T, s blockstore.Store) {
	const n = 8
	datas := make([][]byte, n)
	for i := range datas {
		datas[i] = random(t, 256<<10)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.Put(context.Background(), "race/obj", datas[i])
		}()
	}
	wg.Wait()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil:
			if winner >= 0 {
				t.Fatalf("Put %d and %d both succeeded", winner, i)
			}
			winner = i
		case errors.Is(err, blockstore.ErrExists):
		default:
			t.Fatalf("Put %d: %v", i, err)
		}
	}
	if winner < 0 {
		t.Fatal("no Put succeeded")
	}
	if got := mustGet(t, s, "race/obj"); !bytes.Equal(got, datas[winner]) {
		t.Fatal("stored object is not the winner's data")
	}
}

func testNoPartial(t *testing.T, s blockstore.Store) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const objs = 6
	datas := make([][]byte, objs)
	for i := range datas {
		datas[i] = random(t, 2<<20)
	}
	var wg sync.WaitGroup
	readErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			for i := range objs {
				b, err := s.Get(ctx, fmt.Sprintf("big/%d", i))
				switch {
				case errors.Is(err, blockstore.ErrNotFound) || ctx.Err() != nil:
				case err != nil:
					readErr <- err
					return
				case !bytes.Equal(b, datas[i]):
					readErr <- fmt.Errorf("Get(big/%d) saw %d bytes that are not the object", i, len(b))
					return
				}
			}
		}
	}()
	for i := range objs {
		mustPut(t, s, fmt.Sprintf("big/%d", i), datas[i])
	}
	cancel()
	wg.Wait()
	select {
	case err := <-readErr:
		t.Fatal(err)
	default:
	}
}

func testCancelled(t *testing.T, s blockstore.Store) {
	mustPut(t, s, "c/x", []byte("x"))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Put(ctx, "c/y", []byte("y")); err == nil {
		t.Error("Put with a cancelled context succeeded")
	}
	if _, err := s.Get(ctx, "c/x"); err == nil {
		t.Error("Get with a cancelled context succeeded")
	}
	if _, err := s.List(ctx, "c/"); err == nil {
		t.Error("List with a cancelled context succeeded")
	}
	if _, err := s.Get(context.Background(), "c/y"); !errors.Is(err, blockstore.ErrNotFound) {
		t.Errorf("Put with a cancelled context left an object: %v", err)
	}
}

func testPutCopies(t *testing.T, s blockstore.Store) {
	data := []byte("original")
	mustPut(t, s, "p", data)
	copy(data, "XXXXXXXX")
	if got := mustGet(t, s, "p"); string(got) != "original" {
		t.Fatalf("Get = %q after the caller reused its buffer", got)
	}
}

// testGetBuffer: a store that offers GetBuffer answers as Get does, into
// the given storage when it fits, and grows a buffer that is too small.
func testGetBuffer(t *testing.T, s blockstore.Store) {
	bg, ok := s.(blockstore.BufferGetter)
	if !ok {
		t.Fatal("the store has no GetBuffer")
	}
	ctx := context.Background()
	data := random(t, 70000)
	mustPut(t, s, "g/obj", data)
	big := make([]byte, 5, 100000)
	got, err := bg.GetBuffer(ctx, "g/obj", big)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("GetBuffer = %d bytes, %v; want the object", len(got), err)
	}
	if &got[0] != &big[:1][0] {
		t.Error("GetBuffer allocated although the object fits the buffer")
	}
	got, err = bg.GetBuffer(ctx, "g/obj", make([]byte, 0, 10))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("GetBuffer into a small buffer = %d bytes, %v; want the object", len(got), err)
	}
	for _, key := range []string{"missing", "g/c", "g/obj/c", "g"} {
		b, err := bg.GetBuffer(ctx, key, big)
		if !errors.Is(err, blockstore.ErrNotFound) {
			t.Errorf("GetBuffer(%q) = %d bytes, %v; want ErrNotFound", key, len(b), err)
		}
	}
	if _, err := bg.GetBuffer(ctx, "../x", big); !errors.Is(err, blockstore.ErrInvalidKey) {
		t.Errorf("GetBuffer of an invalid key = %v, want ErrInvalidKey", err)
	}
}

// testListInfo: a Lister's ListInfo names the same keys as List, with
// each object's size and a modification time around its Put (stores keep
// seconds, so a second of slack either side).
func testListInfo(t *testing.T, s blockstore.Store) {
	l, ok := s.(blockstore.Lister)
	if !ok {
		t.Skip("not a blockstore.Lister")
	}
	ctx := context.Background()
	before := time.Now().Add(-time.Second)
	sizes := map[string]int{"li/a": 0, "li/b/c": 1, "li/b/d": 70 << 10, "lj/x": 3}
	for k, n := range sizes {
		mustPut(t, s, k, random(t, n))
	}
	after := time.Now().Add(time.Second)
	for _, prefix := range []string{"", "li/", "li/b", "nothing/"} {
		keys, err := s.List(ctx, prefix)
		if err != nil {
			t.Fatalf("List(%q): %v", prefix, err)
		}
		infos, err := l.ListInfo(ctx, prefix)
		if err != nil {
			t.Fatalf("ListInfo(%q): %v", prefix, err)
		}
		if len(infos) != len(keys) {
			t.Fatalf("ListInfo(%q) has %d objects, List %d", prefix, len(infos), len(keys))
		}
		for i, o := range infos {
			if o.Key != keys[i] {
				t.Errorf("ListInfo(%q)[%d] = %q, List has %q", prefix, i, o.Key, keys[i])
			}
			if int64(sizes[o.Key]) != o.Size {
				t.Errorf("ListInfo(%q): %s has size %d, want %d", prefix, o.Key, o.Size, sizes[o.Key])
			}
			if o.ModTime.Before(before) || o.ModTime.After(after) {
				t.Errorf("ListInfo(%q): %s modified %s, outside [%s, %s]", prefix, o.Key, o.ModTime, before, after)
			}
		}
	}
	if _, err := l.ListInfo(ctx, "../"); !errors.Is(err, blockstore.ErrInvalidKey) {
		t.Errorf("ListInfo(\"../\") = %v, want ErrInvalidKey", err)
	}
}

// testGetRange: a RangeGetter reads exactly the bytes asked, into the
// buffer given when they fit; a range past the object's end, a missing
// object, a bad key and a length over the key's bound are errors.
func testGetRange(t *testing.T, s blockstore.Store) {
	rg := s.(blockstore.RangeGetter)
	ctx := context.Background()
	data := random(t, 70000)
	mustPut(t, s, "g/obj", data)
	buf := make([]byte, 0, 10000)
	for _, r := range [][2]int{{0, 1}, {100, 5000}, {69999, 1}, {0, 70000}} {
		got, err := rg.GetRange(ctx, "g/obj", int64(r[0]), r[1], buf)
		if err != nil || !bytes.Equal(got, data[r[0]:r[0]+r[1]]) {
			t.Fatalf("GetRange(%d, %d) = %d bytes, %v; want the range", r[0], r[1], len(got), err)
		}
		if r[1] <= cap(buf) && &got[0] != &buf[:1][0] {
			t.Errorf("GetRange(%d, %d) allocated although the range fits the buffer", r[0], r[1])
		}
	}
	for _, r := range [][2]int{{69999, 2}, {70000, 1}, {1 << 20, 10}} {
		if got, err := rg.GetRange(ctx, "g/obj", int64(r[0]), r[1], buf); err == nil {
			t.Errorf("GetRange(%d, %d) past the end = %d bytes, no error", r[0], r[1], len(got))
		}
	}
	if _, err := rg.GetRange(ctx, "g/missing", 0, 10, buf); !errors.Is(err, blockstore.ErrNotFound) {
		t.Errorf("GetRange of a missing object = %v, want ErrNotFound", err)
	}
	if _, err := rg.GetRange(ctx, "../x", 0, 10, buf); !errors.Is(err, blockstore.ErrInvalidKey) {
		t.Errorf("GetRange of an invalid key = %v, want ErrInvalidKey", err)
	}
	chunk := "v/x/chunks/ab/obj"
	if _, err := rg.GetRange(ctx, chunk, 0, int(blockstore.MaxChunkObject)+1, nil); !errors.Is(err, blockstore.ErrTooLarge) {
		t.Errorf("GetRange over the key's bound = %v, want ErrTooLarge", err)
	}
}

// testPack: a pack written by appends is invisible (Get, List) until its
// Commit, whole after it; a second pack of the same key gets ErrExists
// and leaves the first; an aborted one leaves nothing.
func testPack(t *testing.T, s blockstore.Store) {
	p := s.(blockstore.Packer)
	ctx := context.Background()
	const key = "v/x/packs/0123456789abcdef0123456789abcdef"
	data := random(t, 3<<20)
	pw, err := p.NewPack(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	for off := 0; off < len(data); off += 70000 {
		if _, err := pw.Write(data[off:min(off+70000, len(data))]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Get(ctx, key); !errors.Is(err, blockstore.ErrNotFound) {
		t.Fatalf("Get of a pack before its Commit = %v, want ErrNotFound", err)
	}
	if keys, err := s.List(ctx, ""); err != nil || len(keys) != 0 {
		t.Fatalf("List before the Commit = %q, %v; want nothing", keys, err)
	}
	if err := pw.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, s, key); !bytes.Equal(got, data) {
		t.Fatalf("the committed pack reads %d bytes, want its %d", len(got), len(data))
	}
	again, err := p.NewPack(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := again.Write([]byte("other")); err != nil {
		t.Fatal(err)
	}
	if err := again.Commit(ctx); !errors.Is(err, blockstore.ErrExists) {
		t.Fatalf("Commit of a pack over an existing key = %v, want ErrExists", err)
	}
	if got := mustGet(t, s, key); !bytes.Equal(got, data) {
		t.Fatal("a second pack of the key replaced the first")
	}
	ab, err := p.NewPack(ctx, "v/x/packs/aborted")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ab.Write(data[:100]); err != nil {
		t.Fatal(err)
	}
	ab.Abort()
	if keys, err := s.List(ctx, ""); err != nil || len(keys) != 1 || keys[0] != key {
		t.Fatalf("List after an abort = %q, %v; want the committed pack only", keys, err)
	}
}
