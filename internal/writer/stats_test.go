package writer

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/nbdsrv"
)

// The supervisor reads a running writer's stats over its control socket;
// AllStats reads every listed writer's and leaves out a dir whose writer
// is gone; a writer that never answers costs at most statsTimeout.
func TestSupervisorStats(t *testing.T) {
	r := newCtlRig(t, "w")
	root := filepath.Dir(r.spec.Dir)
	s := &Supervisor{Root: root}
	ctx := context.Background()
	st, err := s.Stats(ctx, r.spec.Dir)
	if err != nil {
		t.Fatal(err)
	}
	want := Stats{PID: 7, Epoch: r.spec.Epoch, NBDErrors: nbdsrv.Errors{Read: 3}, Reconnects: 1}
	if st != want {
		t.Fatalf("stats %+v, want %+v", st, want)
	}
	// A dir with a state file but no writer (killed): not running.
	gone := filepath.Join(root, "gone")
	if err := os.MkdirAll(gone, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{gone, r.spec.Dir} {
		if err := os.WriteFile(filepath.Join(d, StateName), []byte("{}"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Stats(ctx, gone); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("stats of a dir without a writer: %v, want ErrNotRunning", err)
	}
	// A persistent volume's writer, one level down, is asked too (here
	// a dead one: left out, as gone's).
	vol := filepath.Join(root, VolumesDir, "sb-1-g1", "data")
	if err := os.MkdirAll(vol, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(vol, StateName), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	all, err := s.AllStats(ctx)
	if err != nil || len(all) != 1 || all[0].Dir != r.spec.Dir || all[0].Err != nil || all[0].Stats != want {
		t.Fatalf("AllStats: %+v, %v", all, err)
	}
	// A volume writer that runs is read (its control socket answers).
	vr := newCtlRig(t, filepath.Join(VolumesDir, "sb-2-g1", "data"))
	if err := os.WriteFile(filepath.Join(vr.spec.Dir, StateName), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	vs := &Supervisor{Root: filepath.Dir(filepath.Dir(filepath.Dir(vr.spec.Dir)))}
	if all, err := vs.AllStats(ctx); err != nil || len(all) != 1 || all[0].Dir != vr.spec.Dir || all[0].Err != nil || all[0].Stats.NBDErrors.Read != 3 {
		t.Fatalf("AllStats of a volume writer: %+v, %v", all, err)
	}
	if _, err := s.Stats(ctx, "/elsewhere/w"); err == nil {
		t.Fatal("stats of a dir outside the root: no error")
	}

	// A hung writer: it accepts and never answers.
	hung := filepath.Join(root, "hung")
	if err := os.MkdirAll(hung, 0o700); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", filepath.Join(hung, CtlName))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	t0 := time.Now()
	if _, err := s.Stats(ctx, hung); err == nil {
		t.Fatal("stats of a writer that never answers: no error")
	}
	if d := time.Since(t0); d > statsTimeout+time.Second {
		t.Fatalf("stats of a hung writer took %v", d)
	}
}
