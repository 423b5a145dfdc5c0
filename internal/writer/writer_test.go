package writer_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/writer"
)

func validSpec() writer.Spec {
	return writer.Spec{
		Sandbox: "sb", Generation: 1, Epoch: 1, StoreDir: "/s", NodeKeyFile: "/k", NodeKeyID: "node",
		Base: blockstore.GenRef{Volume: blockstore.Template("t")}, Dir: "/w/sb", Index: -1,
		DeadConnTimeout: 30 * time.Second,
	}
}

func TestSpecCheck(t *testing.T) {
	s := validSpec()
	if err := s.Check(); err != nil || s.RequestTimeout != writer.DefaultRequestTimeout {
		t.Fatalf("valid spec: %v, request timeout %v", err, s.RequestTimeout)
	}
	for name, mut := range map[string]func(*writer.Spec){
		"no sandbox":        func(s *writer.Spec) { s.Sandbox = "" },
		"epoch 0":           func(s *writer.Spec) { s.Epoch = 0 },
		"relative store":    func(s *writer.Spec) { s.StoreDir = "s" },
		"relative key":      func(s *writer.Spec) { s.NodeKeyFile = "k" },
		"unclean dir":       func(s *writer.Spec) { s.Dir = "/w/../sb" },
		"root dir":          func(s *writer.Spec) { s.Dir = "/" },
		"index":             func(s *writer.Spec) { s.Index = -2 },
		"dead conn timeout": func(s *writer.Spec) { s.DeadConnTimeout = 1500 * time.Millisecond },
		"request timeout":   func(s *writer.Spec) { s.RequestTimeout = 500 * time.Millisecond },
		"key id":            func(s *writer.Spec) { s.NodeKeyID = "Bad ID" },
		"base volume":       func(s *writer.Spec) { s.Base.Volume.ID = "" },
		"reattach no index": func(s *writer.Spec) { s.Reattach = true },
	} {
		s := validSpec()
		mut(&s)
		if err := s.Check(); !errors.Is(err, writer.ErrInvalidSpec) {
			t.Errorf("%s: %v, want ErrInvalidSpec", name, err)
		}
	}
}

// An invalid spec touches nothing: not even its Dir is made.
func TestRunInvalidSpecTouchesNothing(t *testing.T) {
	s := validSpec()
	s.Dir = filepath.Join(t.TempDir(), "w")
	s.Epoch = 0
	if err := writer.Run(context.Background(), s, nil); !errors.Is(err, writer.ErrInvalidSpec) {
		t.Fatalf("Run: %v", err)
	}
	if _, err := os.Stat(s.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("dir made for an invalid spec: %v", err)
	}
}

// A held lock refuses a second writer with ErrBusy (exit code 3) before
// it looks at anything else.
func TestRunBusy(t *testing.T) {
	s := validSpec()
	s.Dir = t.TempDir()
	f, err := os.OpenFile(filepath.Join(s.Dir, writer.LockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	err = writer.Run(context.Background(), s, nil)
	if !errors.Is(err, writer.ErrBusy) || writer.ExitCode(err) != writer.ExitBusy {
		t.Fatalf("Run with the lock held: %v (exit %d), want ErrBusy", err, writer.ExitCode(err))
	}
}

// A state file of the same or a later epoch refuses the spec: an older
// attach never replaces a newer one.
func TestRunStaleEpoch(t *testing.T) {
	for _, epoch := range []uint64{5, 7} {
		s := validSpec()
		s.Dir = t.TempDir()
		s.Epoch = 5
		writeJSON(t, filepath.Join(s.Dir, writer.StateName), writer.State{PID: 1, Epoch: epoch, Index: 3})
		err := writer.Run(context.Background(), s, nil)
		if !errors.Is(err, writer.ErrStaleEpoch) || writer.ExitCode(err) != writer.ExitStale {
			t.Fatalf("state epoch %d, spec 5: %v, want ErrStaleEpoch", epoch, err)
		}
		if _, err := os.Stat(filepath.Join(s.Dir, writer.StateName)); err != nil {
			t.Fatalf("the newer state file was touched: %v", err)
		}
	}
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// selfState is a State naming this test process.
func selfState(t *testing.T, epoch uint64) writer.State {
	t.Helper()
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Fatal(err)
	}
	st, err := writer.ParseStartTime(b)
	if err != nil {
		t.Fatal(err)
	}
	return writer.State{PID: os.Getpid(), StartTime: st, Epoch: epoch, Index: 2, Device: "/dev/nbd2"}
}

// Check takes a writer for running only when its pid and start time are
// alive, it holds the lock, and its epoch is the last spec's.
func TestSupervisorCheck(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "sb")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	sup := &writer.Supervisor{Root: root}
	ctx := context.Background()
	notRunning := func(why string) {
		t.Helper()
		if st, err := sup.Check(ctx, dir); !errors.Is(err, writer.ErrNotRunning) {
			t.Fatalf("%s: Check = %+v, %v; want ErrNotRunning", why, st, err)
		}
	}
	notRunning("no state")
	spec := validSpec()
	spec.Dir, spec.Epoch = dir, 4
	writeJSON(t, filepath.Join(dir, writer.SpecName), spec)
	me := selfState(t, 4)
	writeJSON(t, filepath.Join(dir, writer.StateName), me)
	notRunning("lock not held")
	f, err := os.OpenFile(filepath.Join(dir, writer.LockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	if st, err := sup.Check(ctx, dir); err != nil || st != me {
		t.Fatalf("Check = %+v, %v; want %+v", st, err, me)
	}
	if got, err := sup.List(ctx); err != nil || len(got) != 1 || got[0] != dir {
		t.Fatalf("List = %v, %v", got, err)
	}
	reused := me
	reused.StartTime++ // the pid now names another process
	writeJSON(t, filepath.Join(dir, writer.StateName), reused)
	notRunning("pid reused")
	writeJSON(t, filepath.Join(dir, writer.StateName), selfState(t, 3))
	notRunning("stale epoch 3 under spec epoch 4")
	if _, err := sup.Check(ctx, "/elsewhere/sb"); !errors.Is(err, writer.ErrInvalidSpec) {
		t.Fatalf("Check outside Root: %v", err)
	}
	if ok, detail := sup.CheckGone(ctx, dir, -1); ok {
		t.Fatalf("CheckGone with the lock held: ok (%s)", detail)
	}
}
