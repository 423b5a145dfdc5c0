package cowdev_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/cowdev"
)

func sbGen(g uint64) blockstore.GenRef {
	return blockstore.GenRef{Volume: blockstore.Sandbox("sb-1"), Generation: g}
}

// scribble writes, trims and zeroes a few ranges of d and returns the
// device's contents after.
func scribble(t *testing.T, d *cowdev.Device, seed byte, chunks ...int64) []byte {
	t.Helper()
	for k, i := range chunks {
		p := make([]byte, cs/2+int(k)*100)
		for j := range p {
			p[j] = seed + byte(j%251)
		}
		if _, err := d.WriteAt(p, i*cs+int64(k)*37); err != nil {
			t.Fatal(err)
		}
	}
	return readAll(t, d)
}

func seal(t *testing.T, d *cowdev.Device, ref blockstore.GenRef) cowdev.SealStats {
	t.Helper()
	st, err := d.Seal(context.Background(), ref)
	if err != nil {
		t.Fatalf("Seal(%s): %v", ref, err)
	}
	if st.Ref != ref || d.Base() != ref {
		t.Fatalf("Seal(%s): stats name %s, device base %s", ref, st.Ref, d.Base())
	}
	return st
}

// A seal commits exactly the device's contents as a generation over its
// base and rebases the device onto it: nothing is dirty after, a second
// seal with nothing written commits an empty generation, and what is
// written next (over sealed chunks, clean ones and trims of sealed ones)
// seals as the next generation; a re-open over the last generation finds
// it all.
func TestSealRebase(t *testing.T) {
	f := newFixture(t, 32)
	dir := t.TempDir()
	d := open(t, f, tpl0, dir)
	scribble(t, d, 1, 1, 2, 5, 9, 20)
	if err := d.Trim(12*cs, 2*cs); err != nil {
		t.Fatal(err)
	}
	want := readAll(t, d)
	dirty := len(d.Dirty())

	st := seal(t, d, sbGen(1))
	if st.Parent != tpl0 || st.DataChunks+st.ZeroChunks != dirty || st.ZeroChunks != 2 || st.Bytes != int64(st.DataChunks)*cs {
		t.Fatalf("first seal: %+v; want parent %s, %d chunks, 2 of them zero", st, tpl0, dirty)
	}
	if n := len(d.Dirty()); n != 0 {
		t.Fatalf("%d chunks dirty after the seal", n)
	}
	same(t, "device after the seal", readAll(t, d), want)
	same(t, "fresh device on generation 1", readAll(t, open(t, f, sbGen(1), t.TempDir())), want)

	st = seal(t, d, sbGen(2))
	if st.DataChunks+st.ZeroChunks != 0 {
		t.Fatalf("seal with nothing written: %+v, want no chunks", st)
	}
	m, err := f.repo.Manifest(context.Background(), sbGen(2))
	if err != nil || len(m.Entries) != 0 || *m.Parent != sbGen(1) {
		t.Fatalf("empty generation 2: %+v, %v", m, err)
	}

	// Sealed chunks 1 and 5 written again (partly), clean chunk 30, a
	// sealed trim (12) written and a sealed data chunk (20) trimmed.
	scribble(t, d, 2, 1, 5, 30, 12)
	if err := d.Trim(20*cs, cs); err != nil {
		t.Fatal(err)
	}
	want = readAll(t, d)
	if got := d.Dirty(); !slices.Equal(got, []uint64{1, 5, 12, 20, 30}) {
		t.Fatalf("dirty after the third round of writes: %v", got)
	}
	st = seal(t, d, sbGen(3))
	if st.DataChunks != 4 || st.ZeroChunks != 1 {
		t.Fatalf("third seal: %+v, want 4 data chunks and 1 zero", st)
	}
	same(t, "fresh device on generation 3", readAll(t, open(t, f, sbGen(3), t.TempDir())), want)
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d = open(t, f, sbGen(3), dir)
	same(t, "re-opened over generation 3", readAll(t, d), want)
	if n := len(d.Dirty()); n != 0 {
		t.Fatalf("%d chunks dirty after the re-open", n)
	}
}

// Writes during a seal's upload are not held: each sealed chunk a write
// reaches before it was uploaded is saved first, so the generation is the
// device as it was at the barrier, and the chunks written stay dirty for
// the next seal.
func TestSealCopyOnWriteDuringUpload(t *testing.T) {
	f := newFixture(t, 32)
	d := open(t, f, tpl0, t.TempDir())
	scribble(t, d, 3, 0, 1, 2, 3, 4, 5, 6, 7)
	if err := d.Trim(8*cs, cs); err != nil {
		t.Fatal(err)
	}
	atBarrier := readAll(t, d)
	var during []byte
	d.SetSealHook(func(i uint64) {
		if i != 0 {
			return
		}
		// Sealed chunks 0 (uploaded), 2, 4 (not yet), 8 (a trim)
		// written; 6 trimmed; clean chunk 25 written. A held barrier
		// would deadlock here.
		during = scribble(t, d, 4, 0, 2, 4, 8, 25)
		if err := d.Trim(6*cs, cs); err != nil {
			t.Error(err)
		}
		during = readAll(t, d)
	})
	st := seal(t, d, sbGen(1))
	d.SetSealHook(nil)
	if st.DataChunks != 8 || st.ZeroChunks != 1 {
		t.Fatalf("seal: %+v, want 8 data chunks, 1 zero", st)
	}
	same(t, "generation 1 (the device at the barrier)", readAll(t, open(t, f, sbGen(1), t.TempDir())), atBarrier)
	same(t, "device after the seal", readAll(t, d), during)
	if got := d.Dirty(); !slices.Equal(got, []uint64{0, 2, 4, 6, 8, 25}) {
		t.Fatalf("dirty after the seal: %v; want the chunks written during it", got)
	}
	seal(t, d, sbGen(2))
	same(t, "generation 2", readAll(t, open(t, f, sbGen(2), t.TempDir())), during)
}

// A seal that fails (a generation that exists; the caller's context
// ended during the upload) changes nothing: the device keeps its base,
// contents and dirty set, no generation appears, and a later seal works.
func TestSealFailureChangesNothing(t *testing.T) {
	f := newFixture(t, 16)
	d := open(t, f, tpl0, t.TempDir())
	want := scribble(t, d, 5, 1, 3, 7)
	dirty := d.Dirty()
	commit(t, f.repo, blockstore.CommitSpec{Generation: sbGen(1), Parent: &tpl0, DeviceSize: uint64(len(f.base))}, nil)
	if _, err := d.Seal(context.Background(), sbGen(1)); !errors.Is(err, blockstore.ErrExists) {
		t.Fatalf("seal as an existing generation: %v, want ErrExists", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	d.SetSealHook(func(uint64) { cancel() })
	if _, err := d.Seal(ctx, sbGen(2)); !errors.Is(err, context.Canceled) {
		t.Fatalf("seal with its context canceled during the upload: %v", err)
	}
	d.SetSealHook(nil)
	if gens, err := f.repo.Generations(context.Background(), sbGen(0).Volume); err != nil || !slices.Equal(gens, []uint64{1}) {
		t.Fatalf("generations after the failed seals: %v, %v; want only [1]", gens, err)
	}
	if d.Base() != tpl0 || !slices.Equal(d.Dirty(), dirty) {
		t.Fatalf("after the failed seals: base %s, dirty %v; want %s, %v", d.Base(), d.Dirty(), tpl0, dirty)
	}
	same(t, "device after the failed seals", readAll(t, d), want)
	seal(t, d, sbGen(2))
	same(t, "generation 2", readAll(t, open(t, f, sbGen(2), t.TempDir())), want)
}

// copyState copies a device dir's dirty file and index into a new dir.
func copyState(t *testing.T, from string) string {
	t.Helper()
	to := t.TempDir()
	for _, n := range []string{"dirty", "index"} {
		b, err := os.ReadFile(filepath.Join(from, n))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, n), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return to
}

// The crash windows of a seal re-open correctly: the index of before the
// rebase (a crash between the commit and the index's replacement) over
// the new generation and over the old base; the index of after it over
// the old base (the spec not yet naming the new generation), which opens
// over the new one. A spec two seals behind the index is refused.
func TestSealCrashWindowsReopen(t *testing.T) {
	f := newFixture(t, 16)
	dir := t.TempDir()
	d := open(t, f, tpl0, dir)
	scribble(t, d, 6, 2, 4, 9)
	if err := d.Trim(11*cs, cs); err != nil {
		t.Fatal(err)
	}
	want := readAll(t, d)
	var before string // the dir as the seal's upload began
	d.SetSealHook(func(uint64) {
		if before == "" {
			before = copyState(t, dir)
		}
	})
	seal(t, d, sbGen(1))
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	for k, c := range []struct {
		what      string
		dir       string
		base, got blockstore.GenRef
	}{
		{"index before the rebase, spec at the new generation", copyState(t, before), sbGen(1), sbGen(1)},
		{"index before the rebase, spec at the old base", copyState(t, before), tpl0, tpl0},
		{"index after the rebase, spec at the old base", copyState(t, dir), tpl0, sbGen(1)},
		{"index after the rebase, spec at the new generation", copyState(t, dir), sbGen(1), sbGen(1)},
	} {
		d := open(t, f, c.base, c.dir)
		if d.Base() != c.got {
			t.Fatalf("%s: base %s, want %s", c.what, d.Base(), c.got)
		}
		same(t, c.what, readAll(t, d), want)
		// And it seals on from there.
		next := sbGen(10 + uint64(k))
		_ = scribble(t, d, 7, 3)
		want2 := readAll(t, d)
		seal(t, d, next)
		same(t, c.what+", sealed on", readAll(t, open(t, f, next, t.TempDir())), want2)
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
	}

	// Two seals ahead of the spec: refused.
	d = open(t, f, sbGen(1), dir)
	seal(t, d, sbGen(2))
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := cowdev.Open(context.Background(), cowdev.Config{Repo: f.repo, Base: tpl0, Dir: dir}); !errors.Is(err, cowdev.ErrMismatch) {
		t.Fatalf("Open two seals behind the index: %v, want ErrMismatch", err)
	}
}

// Seals run while writers write, trim and read (run with -race): every
// seal succeeds, the device reads its writes, and the last seal, once
// the writers stopped, is the device byte for byte.
func TestSealConcurrentWrites(t *testing.T) {
	f := newFixture(t, 64)
	d := open(t, f, tpl0, t.TempDir())
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 4)
	for w := range 4 {
		go func() {
			p := make([]byte, cs+cs/3)
			for n := 0; ctx.Err() == nil; n++ {
				off := int64((n*7+w*13)%60)*cs + int64(n%5)*111
				for j := range p {
					p[j] = byte(n + w + j)
				}
				if _, err := d.WriteAt(p, off); err != nil {
					done <- err
					return
				}
				got := make([]byte, len(p))
				if _, err := d.ReadAt(got, off); err != nil {
					done <- err
					return
				}
				if n%9 == 0 {
					if err := d.Trim(int64((n+w)%60)*cs, cs); err != nil {
						done <- err
						return
					}
				}
			}
			done <- nil
		}()
	}
	for g := uint64(1); g <= 8; g++ {
		seal(t, d, sbGen(g))
	}
	stop()
	for range 4 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	want := readAll(t, d)
	seal(t, d, sbGen(9))
	same(t, "generation 9", readAll(t, open(t, f, sbGen(9), t.TempDir())), want)
}
