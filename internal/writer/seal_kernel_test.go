package writer_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/writer"
)

// readDirect reads the whole device with O_DIRECT: through the writer,
// not the page cache.
func readDirect(t testing.TB, dev string, size int64) []byte {
	t.Helper()
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	const step = 1 << 20
	buf, err := unix.Mmap(-1, 0, step, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(buf)
	out := make([]byte, 0, size)
	for off := int64(0); off < size; off += step {
		n, err := unix.Pread(fd, buf, off)
		if err != nil || n != step {
			t.Fatalf("read %s at %d: n=%d err=%v", dev, off, n, err)
		}
		out = append(out, buf...)
	}
	return out
}

// readGen reads every chunk of generation ref from the store.
func (s *store) readGen(t testing.TB, ref blockstore.GenRef) []byte {
	t.Helper()
	im, err := s.repo.Open(context.Background(), ref)
	if err != nil {
		t.Fatalf("open %s: %v", ref, err)
	}
	cs := uint64(im.ChunkSize())
	out := make([]byte, im.DeviceSize())
	for i := uint64(0); i < im.Chunks(); i++ {
		if err := im.ReadChunk(context.Background(), i, out[i*cs:(i+1)*cs]); err != nil {
			t.Fatalf("read chunk %d of %s: %v", i, ref, err)
		}
	}
	return out
}

// writeDev writes p at off through the device and fsyncs it (the
// writer's flush: acknowledged writes are in its dirty state), and
// applies it to model.
func writeDev(t testing.TB, dev string, model, p []byte, off int64) {
	t.Helper()
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(p, off); err != nil {
		t.Fatalf("write %s at %d: %v", dev, off, err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync %s: %v", dev, err)
	}
	if model != nil {
		copy(model[off:], p)
	}
}

func randBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// sameBytes fails with the first differing offset.
func sameBytes(t testing.TB, what string, got, want []byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d bytes, want %d", what, len(got), len(want))
	}
	if !bytes.Equal(got, want) {
		i := 0
		for got[i] == want[i] {
			i++
		}
		t.Fatalf("%s: differs first at byte %d: got %#x, want %#x", what, i, got[i], want[i])
	}
}

// A running writer's device sealed through the supervisor: the committed
// generation read from the store is the device byte for byte (and the
// model of what was written); a second seal over the first holds the next
// writes; a seal with nothing written commits an empty generation; a seal
// of another epoch is ErrStaleEpoch and commits nothing. After a kill -9
// of the writer, the primary's restart (Reattach, the next epoch) naming
// the generation before the last seal opens over the last one all the
// same (and names it in spec.json), and after a second kill -9 a restart
// naming the last seal does too; both serve the same data and seal on.
func TestKernelWriterSeal(t *testing.T) {
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	r := newRig(t)
	const size = 64 << 20
	baseChunk := randBytes(64 << 10)
	tpl := r.st.template(t, "small", size, map[uint64][]byte{3: baseChunk, 500: baseChunk})
	dir := filepath.Join(r.sup.Root, "sb-1")
	spec := r.st.spec(tpl, dir, 1)
	spec.RequestTimeout, spec.DeadConnTimeout = 10*time.Second, 60*time.Second
	st := r.start(t, spec)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	vol := blockstore.Sandbox(spec.Sandbox)
	gen := func(g uint64) blockstore.GenRef { return blockstore.GenRef{Volume: vol, Generation: g} }

	model := readDirect(t, st.Device, size)
	sameBytes(t, "the device before any write", model, r.st.readGen(t, tpl))
	writeDev(t, st.Device, model, randBytes(1<<20), 0)             // chunks 0-15, over base chunk 3
	writeDev(t, st.Device, model, randBytes(100<<10), 5<<20+4096)  // partial chunks
	writeDev(t, st.Device, model, make([]byte, 64<<10), 500<<16)   // a base chunk zeroed by a write
	writeDev(t, st.Device, model, randBytes(8<<10), size-(12<<10)) // the last chunk, partly

	if _, err := r.sup.Seal(ctx, dir, writer.SealRequest{Generation: 1, Epoch: 2}); !errors.Is(err, writer.ErrStaleEpoch) {
		t.Fatalf("Seal of another epoch: %v, want ErrStaleEpoch", err)
	}
	seal := func(g, epoch uint64, parent blockstore.GenRef) writer.SealResult {
		t.Helper()
		res, err := r.sup.Seal(ctx, dir, writer.SealRequest{Generation: g, Epoch: epoch})
		if err != nil {
			t.Fatalf("Seal(generation %d, epoch %d): %v", g, epoch, err)
		}
		if res.Ref != gen(g) || res.Parent != parent || res.Chunks != res.DataChunks+res.ZeroChunks {
			t.Fatalf("Seal(generation %d) = %+v, want %s over %s", g, res, gen(g), parent)
		}
		t.Logf("sealed %s over %s: %d chunks (%d data, %d zero, %d bytes), barrier %v, took %v",
			res.Ref, res.Parent, res.Chunks, res.DataChunks, res.ZeroChunks, res.Bytes, res.Barrier, res.Took)
		sameBytes(t, fmt.Sprintf("generation %d against the model", g), r.st.readGen(t, res.Ref), model)
		sameBytes(t, fmt.Sprintf("the device after sealing generation %d", g), readDirect(t, st.Device, size), model)
		return res
	}
	res := seal(1, 1, tpl)
	if res.DataChunks != 16+2+1+1 || res.ZeroChunks != 0 {
		t.Fatalf("first seal: %d data chunks, %d zero; want 20 data chunks (one of them zeros, stored as a hole)", res.DataChunks, res.ZeroChunks)
	}
	if gens, err := r.st.repo.Generations(ctx, vol); err != nil || !slices.Equal(gens, []uint64{1}) {
		t.Fatalf("generations after the refused and the first seal: %v, %v", gens, err)
	}

	writeDev(t, st.Device, model, randBytes(200<<10), 2<<20)      // new chunks
	writeDev(t, st.Device, model, randBytes(10<<10), 64<<10+1000) // a sealed chunk, partly
	if res := seal(2, 1, gen(1)); res.Chunks != 4+1 {
		t.Fatalf("second seal: %d chunks, want 5 (only what was written since the first)", res.Chunks)
	}
	if res := seal(3, 1, gen(2)); res.Chunks != 0 {
		t.Fatalf("seal with nothing written: %d chunks, want none", res.Chunks)
	}
	var onDisk writer.Spec
	if b, err := os.ReadFile(filepath.Join(dir, writer.SpecName)); err != nil || json.Unmarshal(b, &onDisk) != nil || onDisk.Base != gen(3) {
		t.Fatalf("spec.json after the third seal: base %s (%v), want %s", onDisk.Base, err, gen(3))
	}

	// Acknowledged writes after the last seal, then kill -9; the restart
	// names generation 2 (a primary that died before it recorded the
	// third seal): the writer opens over 3 all the same, and says so in
	// spec.json.
	kill := func(pid int) {
		t.Helper()
		if err := unix.Kill(pid, unix.SIGKILL); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if _, err := r.sup.Check(ctx, dir); errors.Is(err, writer.ErrNotRunning) {
				return
			} else if time.Now().After(deadline) {
				t.Fatalf("Check after kill -9: %v, want ErrNotRunning", err)
			}
		}
	}
	writeDev(t, st.Device, model, randBytes(300<<10), 40<<20)
	kill(st.PID)
	if _, err := r.sup.Seal(ctx, dir, writer.SealRequest{Generation: 4, Epoch: 1}); !errors.Is(err, writer.ErrNotRunning) {
		t.Fatalf("Seal with the writer dead: %v, want ErrNotRunning", err)
	}
	restart := spec
	restart.Epoch, restart.Reattach, restart.Index, restart.Base = 2, true, st.Index, gen(2)
	st = r.start(t, restart)
	if b, err := os.ReadFile(filepath.Join(dir, writer.SpecName)); err != nil || json.Unmarshal(b, &onDisk) != nil || onDisk.Base != gen(3) || onDisk.Epoch != 2 {
		t.Fatalf("spec.json of the restart over generation 2: base %s epoch %d (%v), want %s, epoch 2", onDisk.Base, onDisk.Epoch, err, gen(3))
	}
	sameBytes(t, "the device after the restart", readDirect(t, st.Device, size), model)
	if res := seal(4, 2, gen(3)); res.Chunks != 5 {
		t.Fatalf("seal after the restart: %d chunks, want the 5 written after the last seal", res.Chunks)
	}

	// Again, the restart naming the last seal, as a primary does.
	writeDev(t, st.Device, model, randBytes(64<<10), 50<<20)
	kill(st.PID)
	restart.Epoch, restart.Base = 3, gen(4)
	st = r.start(t, restart)
	sameBytes(t, "the device after the second restart", readDirect(t, st.Device, size), model)
	if res := seal(5, 3, gen(4)); res.Chunks != 1 {
		t.Fatalf("seal after the second restart: %d chunks, want 1", res.Chunks)
	}
}

// BenchmarkSealDeviceSize measures a seal of 4 MiB dirty (64 chunks
// spread over the device) on a 1 GiB and on a 16 GiB device (sparse:
// templates with no chunks), rounds interleaved, and prints the medians
// of the supervisor's Seal call, the writer's seal and its write barrier,
// and the 16 GiB / 1 GiB ratio of the Seal call (goal: at most 1.2: a
// seal's cost follows the dirty data, not the disk). Run:
// make bench VM_PKGS=./internal/writer BENCH=SealDeviceSize
// (CTLD_BENCH_SEALS rounds, default 7).
func BenchmarkSealDeviceSize(b *testing.B) {
	rounds := 7
	if v, err := fmt.Sscan(os.Getenv("CTLD_BENCH_SEALS"), &rounds); v != 1 || err != nil || rounds < 1 {
		rounds = 7
	}
	r := newRig(b)
	ctx := context.Background()
	type dev struct {
		name                string
		size                int64
		dir                 string
		st                  writer.State
		call, took, barrier []time.Duration
	}
	devs := []*dev{{name: "1GiB", size: 1 << 30}, {name: "16GiB", size: 16 << 30}}
	for _, d := range devs {
		tpl := r.st.template(b, "empty-"+strings.ToLower(d.name), uint64(d.size), nil)
		d.dir = filepath.Join(r.sup.Root, "sb-"+strings.ToLower(d.name))
		spec := r.st.spec(tpl, d.dir, 1)
		spec.Sandbox = "sb-" + strings.ToLower(d.name)
		d.st = r.start(b, spec)
	}
	const chunk, dirty = 64 << 10, 64 // 4 MiB
	p := make([]byte, chunk)
	b.ResetTimer()
	for i := range rounds {
		for k := range devs {
			d := devs[(i+k)%len(devs)]
			b.StopTimer()
			f, err := os.OpenFile(d.st.Device, os.O_RDWR, 0)
			if err != nil {
				b.Fatal(err)
			}
			stride := d.size / chunk / dirty
			for c := int64(0); c < dirty; c++ {
				_, _ = rand.Read(p)
				if _, err := f.WriteAt(p, (c*stride+int64(i))*chunk); err != nil {
					b.Fatal(err)
				}
			}
			if err := f.Sync(); err != nil {
				b.Fatal(err)
			}
			_ = f.Close()
			b.StartTimer()
			t0 := time.Now()
			res, err := r.sup.Seal(ctx, d.dir, writer.SealRequest{Generation: uint64(i + 1), Epoch: 1})
			call := time.Since(t0)
			if err != nil {
				b.Fatalf("%s: seal %d: %v", d.name, i+1, err)
			}
			if res.DataChunks != dirty {
				b.Fatalf("%s: seal %d wrote %d data chunks, want %d", d.name, i+1, res.DataChunks, dirty)
			}
			d.call, d.took, d.barrier = append(d.call, call), append(d.took, res.Took), append(d.barrier, res.Barrier)
		}
	}
	b.StopTimer()
	med := func(ds []time.Duration) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[len(s)/2]
	}
	for _, d := range devs {
		fmt.Printf("seal of 4 MiB dirty on %-5s (%d rounds): Seal call p50 %v, writer's seal p50 %v, barrier p50 %v (all calls %v)\n",
			d.name, rounds, med(d.call).Round(time.Microsecond), med(d.took).Round(time.Microsecond), med(d.barrier).Round(time.Microsecond), d.call)
	}
	ratio := float64(med(devs[1].call)) / float64(med(devs[0].call))
	fmt.Printf("seal time ratio 16 GiB / 1 GiB: %.3f (goal <= 1.2); writer's seal %.3f; barrier %.3f\n", ratio,
		float64(med(devs[1].took))/float64(med(devs[0].took)), float64(med(devs[1].barrier))/float64(med(devs[0].barrier)))
	b.ReportMetric(ratio, "ratio16G/1G")
	b.ReportMetric(float64(med(devs[0].call).Microseconds())/1000, "ms/seal-1G")
	b.ReportMetric(float64(med(devs[1].call).Microseconds())/1000, "ms/seal-16G")
}
