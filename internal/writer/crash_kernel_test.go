package writer_test

// The writer outlives its primary; a killed writer loses nothing a flush
// acknowledged; a second writer is refused; a tampered chunk is EIO.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/writer"
)

const (
	lBlock = 4096
	lSlots = 64
)

// loop writes slot i%lSlots = counter i with O_DIRECT, each write followed
// by an fsync (FLUSH): acked[s] is the last counter whose fsync returned,
// tried[s] the last one written at all.
type loop struct {
	n     atomic.Int64 // acknowledged writes
	stop  atomic.Bool
	err   atomic.Value
	done  chan struct{}
	acked [lSlots]int64
	tried [lSlots]int64
}

func startLoop(t *testing.T, dev string) *loop {
	t.Helper()
	// O_CLOEXEC: a writer started while the loop runs must not inherit
	// the fd (it would hold the device's config and keep it from
	// quiescing at the writer's stop).
	fd, err := unix.Open(dev, unix.O_RDWR|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf, err := unix.Mmap(-1, 0, lBlock, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	l := &loop{done: make(chan struct{})}
	for s := range l.acked {
		l.acked[s], l.tried[s] = -1, -1
	}
	go func() {
		defer close(l.done)
		defer unix.Munmap(buf)
		defer unix.Close(fd) // at once on an error: an open fd holds the device's config
		for i := int64(0); !l.stop.Load(); i++ {
			s := i % lSlots
			fill(buf, i)
			l.tried[s] = i
			if _, err := unix.Pwrite(fd, buf, s*lBlock); err != nil {
				l.err.Store(err)
				return
			}
			if err := unix.Fsync(fd); err != nil {
				l.err.Store(err)
				return
			}
			l.acked[s] = i
			l.n.Store(i + 1)
		}
	}()
	t.Cleanup(func() { l.stop.Store(true); <-l.done })
	return l
}

func fill(buf []byte, i int64) {
	for j := 0; j < len(buf); j += 8 {
		binary.LittleEndian.PutUint64(buf[j:], uint64(i))
	}
}

func (l *loop) failed() error { e, _ := l.err.Load().(error); return e }

func (l *loop) waitWrites(t *testing.T, more int64, what string) {
	t.Helper()
	want := l.n.Load() + more
	for deadline := time.Now().Add(60 * time.Second); l.n.Load() < want; time.Sleep(10 * time.Millisecond) {
		if e := l.failed(); e != nil {
			t.Fatalf("%s: the loop saw %v after %d writes", what, e, l.n.Load())
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the loop stuck at %d writes", what, l.n.Load())
		}
	}
}

// slots reads every slot's counter back through dev (O_DIRECT), checking
// each block holds one counter throughout.
func slots(t *testing.T, dev string) [lSlots]int64 {
	t.Helper()
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	buf, err := unix.Mmap(-1, 0, lBlock, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(buf)
	var out [lSlots]int64
	want := make([]byte, lBlock)
	for s := range out {
		if _, err := unix.Pread(fd, buf, int64(s)*lBlock); err != nil {
			t.Fatalf("read slot %d: %v", s, err)
		}
		out[s] = int64(binary.LittleEndian.Uint64(buf))
		if bytes.Equal(buf, make([]byte, lBlock)) {
			out[s] = -1 // never written
			continue
		}
		fill(want, out[s])
		if !bytes.Equal(buf, want) {
			t.Fatalf("slot %d is torn or foreign: starts with counter %d but differs", s, out[s])
		}
	}
	return out
}

// The primary (a process that started the writer through a Supervisor)
// is killed with SIGKILL while a loop writes and fsyncs through the
// device: the loop sees no error, the writer keeps serving, and a new
// Supervisor adopts it through Check.
func TestKernelWriterOutlivesPrimaryKill(t *testing.T) {
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	r := newRig(t)
	ref := r.st.template(t, "small", 16<<20, nil)
	dir := filepath.Join(r.sup.Root, "sb-1")
	spec := r.st.spec(ref, dir, 1)
	spec.DeadConnTimeout = 30 * time.Second
	specFile := filepath.Join(t.TempDir(), "spec.json")
	writeJSON(t, specFile, spec)

	exe, _ := os.Executable()
	primary := exec.Command(exe, "primary", specFile, r.sup.Root, r.sup.Cgroup)
	var perr bytes.Buffer
	primary.Stderr = &perr
	out, err := primary.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := primary.Start(); err != nil {
		t.Fatal(err)
	}
	var st writer.State
	line, err := bufio.NewReader(out).ReadBytes('\n')
	if err == nil {
		err = json.Unmarshal(line, &st)
	}
	if err != nil {
		_ = primary.Process.Kill()
		_ = primary.Wait()
		t.Fatalf("primary: %v\n%s", err, perr.String())
	}
	// From here on the rig's Supervisor (not the writer's parent) stops it.
	t.Cleanup(func() { r.stop(t, dir, st.Index) })
	t.Logf("primary pid %d started writer pid %d on %s", primary.Process.Pid, st.PID, st.Device)

	l := startLoop(t, st.Device)
	l.waitWrites(t, 100, "before the primary died")
	if err := primary.Process.Signal(unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = primary.Wait()
	killedAt := l.n.Load()
	killed := time.Now()
	l.waitWrites(t, 300, "after the primary died")
	t.Logf("writes acknowledged: %d before the kill -9, %d in the %v after it; no error", killedAt, l.n.Load()-killedAt, time.Since(killed).Round(time.Millisecond))

	// A new primary's Supervisor finds the writer alive and current.
	adopter := &writer.Supervisor{Binary: exe, Root: r.sup.Root, Cgroup: r.sup.Cgroup}
	got, err := adopter.Check(context.Background(), dir)
	if err != nil || got != st {
		t.Fatalf("adopting Check = %+v, %v; want %+v", got, err, st)
	}
	if list, err := adopter.List(context.Background()); err != nil || len(list) != 1 || list[0] != dir {
		t.Fatalf("List = %v, %v", list, err)
	}
	l.stop.Store(true)
	<-l.done
	if e := l.failed(); e != nil {
		t.Fatalf("the loop saw %v", e)
	}
	if got := slots(t, st.Device); got != l.acked {
		t.Fatalf("slots %v, acknowledged %v", got, l.acked)
	}
}

// The writer is killed with SIGKILL mid-write; a new writer (the next
// epoch) over the same Dir hands the device a fresh socket: the loop's
// waiting write and fsync complete without an error, and every write
// whose fsync returned is there.
func TestKernelWriterKilledReattach(t *testing.T) {
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	r := newRig(t)
	ref := r.st.template(t, "small", 16<<20, nil)
	dir := filepath.Join(r.sup.Root, "sb-1")
	spec := r.st.spec(ref, dir, 1)
	// A request in flight when the writer died is retried after the
	// request timeout (6.1): keep it short for the test.
	spec.RequestTimeout, spec.DeadConnTimeout = 10*time.Second, 60*time.Second
	st := r.start(t, spec)
	l := startLoop(t, st.Device)
	l.waitWrites(t, 200, "before the writer died")
	if err := unix.Kill(st.PID, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// No write after the one in flight: what was acknowledged before the
	// kill is never overwritten, so the check below sees it.
	l.stop.Store(true)
	ackedAtKill := l.n.Load()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := r.sup.Check(context.Background(), dir); errors.Is(err, writer.ErrNotRunning) {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("Check after kill -9: %v, want ErrNotRunning", err)
		}
	}
	spec.Epoch = 2
	t0 := time.Now()
	st2 := r.start(t, spec)
	if st2.Index != st.Index {
		t.Fatalf("re-attached as %s, want the same device %s", st2.Device, st.Device)
	}
	select {
	case <-l.done:
	case <-time.After(2 * spec.RequestTimeout):
		t.Fatalf("the loop's write in flight did not finish %v after the re-attach", 2*spec.RequestTimeout)
	}
	t.Logf("re-attached %s in %v (start to state); loop: %d acknowledged before the kill, %d in all, the one in flight took %v in all",
		st2.Device, time.Since(t0).Round(time.Millisecond), ackedAtKill, l.n.Load(), time.Since(t0).Round(time.Millisecond))
	if e := l.failed(); e != nil {
		t.Fatalf("the loop saw %v across the writer's death", e)
	}
	if got := slots(t, st2.Device); got != l.acked {
		t.Fatalf("slots %v, acknowledged %v", got, l.acked)
	}
}

// A second Start for a Dir whose writer runs is ErrBusy, and so is a
// second writer process started directly (the lock, not only the
// supervisor's look, refuses it); the first is untouched.
func TestKernelWriterSecondRefused(t *testing.T) {
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	r := newRig(t)
	ref := r.st.template(t, "small", 16<<20, nil)
	dir := filepath.Join(r.sup.Root, "sb-1")
	st := r.start(t, r.st.spec(ref, dir, 1))
	specBefore, _ := os.ReadFile(filepath.Join(dir, writer.SpecName))
	l := startLoop(t, st.Device)
	l.waitWrites(t, 20, "first writer")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if got, err := r.sup.Start(ctx, r.st.spec(ref, dir, 2)); !errors.Is(err, writer.ErrBusy) {
		t.Fatalf("second Start = %+v, %v; want ErrBusy", got, err)
	}
	// Past the supervisor: the process itself refuses, exit code 3.
	other := filepath.Join(t.TempDir(), "spec.json")
	writeJSON(t, other, r.st.spec(ref, dir, 3))
	exe, _ := os.Executable()
	out, err := exec.Command(exe, "writer", "--spec", other).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != writer.ExitBusy {
		t.Fatalf("second writer process: %v, want exit %d\n%s", err, writer.ExitBusy, out)
	}
	t.Logf("second writer refused: %s", bytes.TrimSpace(out))

	l.waitWrites(t, 20, "after the refusals")
	if got, err := r.sup.Check(ctx, dir); err != nil || got != st {
		t.Fatalf("first writer after the refusals: %+v, %v; want %+v", got, err, st)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, writer.SpecName)); !bytes.Equal(b, specBefore) {
		t.Fatalf("the first writer's spec.json was rewritten")
	}
}

// One flipped byte in the one stored chunk: reading that chunk through
// /dev/nbdX is EIO, never other data; the rest of the device reads.
func TestKernelWriterTamperedChunkIsEIO(t *testing.T) {
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	r := newRig(t)
	data := make([]byte, 64<<10)
	_, _ = rand.Read(data)
	ref := r.st.template(t, "tamper", 16<<20, map[uint64][]byte{5: data})
	var objs []string
	root := filepath.Join(r.st.dir, "templates", "tamper", "chunks")
	if err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && !strings.HasPrefix(d.Name(), ".") {
			objs = append(objs, p)
		}
		return err
	}); err != nil || len(objs) != 1 {
		t.Fatalf("chunk objects under %s: %v, %v; want one", root, objs, err)
	}
	b, err := os.ReadFile(objs[0])
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x01
	if err := os.WriteFile(objs[0], b, 0o600); err != nil {
		t.Fatal(err)
	}
	st := r.start(t, r.st.spec(ref, filepath.Join(r.sup.Root, "sb-1"), 1))
	fd, err := unix.Open(st.Device, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	buf, err := unix.Mmap(-1, 0, lBlock, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(buf)
	for _, off := range []int64{5 << 16, 5<<16 + 8192} {
		n, err := unix.Pread(fd, buf, off)
		if !errors.Is(err, unix.EIO) {
			t.Fatalf("read of the tampered chunk at %d: n=%d err=%v, want EIO", off, n, err)
		}
	}
	// A hole of the manifest still reads as zeros: only that chunk fails.
	if n, err := unix.Pread(fd, buf, 6<<16); err != nil || n != lBlock || !bytes.Equal(buf, make([]byte, lBlock)) {
		t.Fatalf("read of a hole: n=%d err=%v", n, err)
	}
}

// The primary's restart of a dead writer (Reattach, the device named):
// refused while the writer lives (ErrBusy) and with no dead writer's
// device to take (ErrNoReattach, nothing attached); after a kill -9 a
// Reattach naming another device is refused without touching the dead
// writer's device (the loop's write keeps waiting, no error), and the
// next epoch naming the right one re-attaches it: the loop completes
// without an error and every acknowledged write is there; so does a
// second restart after the restarted writer is killed. Once the last
// writer stopped, the writers' cgroup is gone.
func TestKernelWriterRestartReattach(t *testing.T) {
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	r := newRig(t)
	ref := r.st.template(t, "small", 16<<20, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// No dead writer: nothing to re-attach, nothing attached.
	fresh := r.st.spec(ref, filepath.Join(r.sup.Root, "sb-0"), 1)
	fresh.Reattach, fresh.Index = true, 0
	if st, err := r.sup.Start(ctx, fresh); !errors.Is(err, writer.ErrNoReattach) {
		t.Fatalf("Reattach with no dead writer = %+v, %v; want ErrNoReattach", st, err)
	}
	if ok, detail := r.sup.CheckGone(ctx, fresh.Dir, 0); !ok {
		t.Fatalf("after the refused Reattach: %s", detail)
	}

	dir := filepath.Join(r.sup.Root, "sb-1")
	spec := r.st.spec(ref, dir, 1)
	spec.RequestTimeout, spec.DeadConnTimeout = 10*time.Second, 60*time.Second
	st := r.start(t, spec)
	l := startLoop(t, st.Device)
	l.waitWrites(t, 100, "before the writer died")

	restart := spec
	restart.Epoch, restart.Reattach, restart.Index = 2, true, st.Index
	if got, err := r.sup.Start(ctx, restart); !errors.Is(err, writer.ErrBusy) {
		t.Fatalf("Reattach while the writer lives = %+v, %v; want ErrBusy", got, err)
	}
	if err := unix.Kill(st.PID, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	l.stop.Store(true) // the write in flight is the last one
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := r.sup.Check(ctx, dir); errors.Is(err, writer.ErrNotRunning) {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("Check after kill -9: %v, want ErrNotRunning", err)
		}
	}
	wrong := restart
	wrong.Epoch, wrong.Index = 3, st.Index+1
	if got, err := r.sup.Start(ctx, wrong); !errors.Is(err, writer.ErrNoReattach) {
		t.Fatalf("Reattach of another device = %+v, %v; want ErrNoReattach", got, err)
	}
	if e := l.failed(); e != nil {
		t.Fatalf("the refused Reattach failed the loop's write: %v", e)
	}
	restart.Epoch = 4
	t0 := time.Now()
	st2 := r.start(t, restart)
	if st2.Index != st.Index || st2.Epoch != 4 {
		t.Fatalf("restarted writer %+v, want epoch 4 on %s", st2, st.Device)
	}
	select {
	case <-l.done:
	case <-time.After(2 * spec.RequestTimeout):
		t.Fatalf("the loop's write in flight did not finish %v after the re-attach", 2*spec.RequestTimeout)
	}
	t.Logf("restarted on %s in %v; %d writes acknowledged", st2.Device, time.Since(t0).Round(time.Millisecond), l.n.Load())
	if e := l.failed(); e != nil {
		t.Fatalf("the loop saw %v across the writer's death", e)
	}
	if got := slots(t, st2.Device); got != l.acked {
		t.Fatalf("slots %v, acknowledged %v", got, l.acked)
	}

	// The restarted writer dies too: the next restart takes the device
	// from it as from the first (its state names the device the same way).
	l2 := startLoop(t, st2.Device)
	l2.waitWrites(t, 100, "before the restarted writer died") // every slot rewritten
	if err := unix.Kill(st2.PID, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	l2.stop.Store(true)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := r.sup.Check(ctx, dir); errors.Is(err, writer.ErrNotRunning) {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("Check after the second kill -9: %v, want ErrNotRunning", err)
		}
	}
	restart.Epoch = 5
	st3 := r.start(t, restart)
	if st3.Index != st.Index {
		t.Fatalf("second restart on %s, want %s", st3.Device, st.Device)
	}
	select {
	case <-l2.done:
	case <-time.After(2 * spec.RequestTimeout):
		t.Fatalf("the loop's write in flight did not finish %v after the second re-attach", 2*spec.RequestTimeout)
	}
	if e := l2.failed(); e != nil {
		t.Fatalf("the loop saw %v across the restarted writer's death", e)
	}
	if got := slots(t, st3.Device); got != l2.acked {
		t.Fatalf("after the second restart: slots %v, acknowledged %v", got, l2.acked)
	}
	r.stop(t, dir, st3.Index)
	if _, err := os.Stat(r.sup.Cgroup); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("writers' cgroup after the last writer stopped: %v, want it removed", err)
	}
}
