package ha

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

func lockInode(t *testing.T, stateDir string) uint64 {
	t.Helper()
	st, err := os.Stat(LockPath(stateDir))
	if err != nil {
		t.Fatalf("stat lock file: %v", err)
	}
	return st.Sys().(*syscall.Stat_t).Ino
}

func TestEpochDurableAndIncreasingAcrossTerms(t *testing.T) {
	dir := t.TempDir()
	if got, err := ReadEpoch(dir); err != nil || got != 0 {
		t.Fatalf("ReadEpoch before any term = %d, %v; want 0, nil", got, err)
	}
	var ino uint64
	for want := uint64(1); want <= 5; want++ {
		// A fresh Elector each time, as after a process restart.
		e := &Elector{StateDir: dir, Slot: "a"}
		term, err := e.WaitPrimary(context.Background())
		if err != nil {
			t.Fatalf("term %d: WaitPrimary: %v", want, err)
		}
		if term.Epoch != want {
			t.Fatalf("term epoch = %d, want %d", term.Epoch, want)
		}
		if got, err := ReadEpoch(dir); err != nil || got != want {
			t.Fatalf("epoch on disk = %d, %v; want %d", got, err, want)
		}
		if err := term.Held(); err != nil {
			t.Fatalf("Held during term: %v", err)
		}
		if err := term.Release(); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if err := term.Release(); err != nil {
			t.Fatalf("second Release: %v", err)
		}
		if err := term.Held(); !errors.Is(err, ErrNotHeld) {
			t.Fatalf("Held after Release = %v, want ErrNotHeld", err)
		}
		if i := lockInode(t, dir); ino == 0 {
			ino = i
		} else if i != ino {
			t.Fatalf("lock file inode changed: %d -> %d", ino, i)
		}
	}
}

func TestSecondElectorBlocksUntilRelease(t *testing.T) {
	dir := t.TempDir()
	a := &Elector{StateDir: dir, Slot: "a"}
	b := &Elector{StateDir: dir, Slot: "b"}
	ta, err := a.WaitPrimary(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		term *Term
		err  error
	}
	got := make(chan result, 1)
	go func() {
		tb, err := b.WaitPrimary(context.Background())
		got <- result{tb, err}
	}()
	select {
	case r := <-got:
		t.Fatalf("second elector became primary (epoch %d, err %v) while the first holds the lock", r.term.Epoch, r.err)
	case <-time.After(300 * time.Millisecond):
	}
	released := time.Now()
	if err := ta.Release(); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("takeover: %v", r.err)
		}
		defer r.term.Release()
		if r.term.Epoch != ta.Epoch+1 {
			t.Fatalf("takeover epoch = %d, want %d", r.term.Epoch, ta.Epoch+1)
		}
		if r.term.Slot != "b" {
			t.Fatalf("takeover slot = %q", r.term.Slot)
		}
		// A blocking flock wakes at once; polling would show up here.
		if d := time.Since(released); d > time.Second {
			t.Fatalf("takeover took %v after release", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("second elector did not take over after Release")
	}
}

func TestWaitPrimaryCancelDoesNotBumpEpoch(t *testing.T) {
	dir := t.TempDir()
	ta, err := (&Elector{StateDir: dir, Slot: "a"}).WaitPrimary(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := (&Elector{StateDir: dir, Slot: "b"}).WaitPrimary(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cancelled WaitPrimary = %v, want deadline exceeded", err)
	}
	if err := ta.Release(); err != nil {
		t.Fatal(err)
	}
	// The abandoned waiter may grab the lock for a moment; it must hand it
	// back without touching the epoch.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	tc, err := (&Elector{StateDir: dir, Slot: "b"}).WaitPrimary(ctx2)
	if err != nil {
		t.Fatalf("takeover after cancelled waiter: %v", err)
	}
	defer tc.Release()
	if tc.Epoch != ta.Epoch+1 {
		t.Fatalf("epoch = %d, want %d (cancelled waiter bumped it?)", tc.Epoch, ta.Epoch+1)
	}
}

func TestHeldDetectsReplacedLockFile(t *testing.T) {
	dir := t.TempDir()
	term, err := (&Elector{StateDir: dir, Slot: "a"}).WaitPrimary(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer term.Release()
	// Simulate an operator deleting the lock: the next process would lock a
	// new inode, so the old holder must see it is no longer exclusive.
	if err := os.Remove(LockPath(dir)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(LockPath(dir), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := term.Held(); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Held after lock file replaced = %v, want ErrNotHeld", err)
	}
}

func TestReadEpochRejectsGarbage(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "ha"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(EpochPath(dir), []byte("seven\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadEpoch(dir); err == nil {
		t.Fatal("ReadEpoch accepted a non-number")
	}
	// And no term may start on an unknown epoch; the lock is given back.
	if _, err := (&Elector{StateDir: dir, Slot: "a"}).WaitPrimary(context.Background()); err == nil {
		t.Fatal("WaitPrimary started a term on a corrupt epoch file")
	}
	if err := os.WriteFile(EpochPath(dir), []byte("41\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	term, err := (&Elector{StateDir: dir, Slot: "a"}).WaitPrimary(ctx)
	if err != nil {
		t.Fatalf("WaitPrimary after repair (lock not given back?): %v", err)
	}
	defer term.Release()
	if term.Epoch != 42 {
		t.Fatalf("epoch = %d, want 42", term.Epoch)
	}
}
