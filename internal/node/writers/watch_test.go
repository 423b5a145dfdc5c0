package writers_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/blockroot"
	"github.com/ctld/ctld/internal/node/fakekernel"
	"github.com/ctld/ctld/internal/node/op"
	"github.com/ctld/ctld/internal/node/pvolume"
	"github.com/ctld/ctld/internal/node/writers"
	"github.com/ctld/ctld/internal/writer"
)

// watchRig is a Watch over the fake kernel's writers and a real journal,
// with the block roots' and volumes' own writer records.
type watchRig struct {
	k     *fakekernel.Kernel
	j     *journal.Journal
	cfg   writers.Config
	w     *writers.Watch
	mu    sync.Mutex
	lost  []error
	crash []string
}

func newWatchRig(t *testing.T) *watchRig {
	t.Helper()
	k, err := fakekernel.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	j, err := journal.Open(filepath.Join(t.TempDir(), "journal.db"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	if err := j.TakeOver(1); err != nil {
		t.Fatal(err)
	}
	r := &watchRig{k: k, j: j, cfg: writers.Config{WritersDir: k.WritersDir(), CheckEvery: 10 * time.Millisecond, RestartAttempts: 2}}
	root := blockroot.New(blockroot.Wiring{Deps: blockroot.Deps{Templates: k.Templates()}, Shared: writers.Shared{Writers: writers.Deps{Devices: k.Blocks()}, Config: r.cfg, Journal: j}})
	r.w = &writers.Watch{
		Config: r.cfg, Devices: k.Blocks(), Journal: j, Term: op.NewTerm(context.Background()), Locks: &op.Locks{},
		Crash: func(p string) {
			r.mu.Lock()
			r.crash = append(r.crash, p)
			r.mu.Unlock()
		},
		Stopped: func() bool { return false }, Log: slog.New(slog.DiscardHandler),
		Root: root.Writers(), Volumes: pvolume.Writers{Journal: j},
		Loser: writers.LoserFunc(func(_ context.Context, _ journal.Sandbox, cause error) {
			r.mu.Lock()
			r.lost = append(r.lost, cause)
			r.mu.Unlock()
		}),
	}
	return r
}

// readyBlock journals a ready block generation of id whose root writer
// runs (index -1 in the record when attached is false).
func (r *watchRig) readyBlock(t *testing.T, id string, attached bool) journal.Sandbox {
	t.Helper()
	cid := id + "-1"
	dir := filepath.Join(r.cfg.WritersDir, cid)
	var s journal.Sandbox
	err := r.j.Update(func(tx *journal.Tx) error {
		epoch, err := tx.NextWriterEpoch()
		if err != nil {
			return err
		}
		st, err := r.k.Blocks().Start(context.Background(), r.cfg.Spec(id, 1, epoch, blockstore.GenRef{Volume: blockstore.Template("busybox")}, dir))
		if err != nil {
			return err
		}
		b := journal.BlockDevice{Dir: dir, Template: "busybox", Index: -1, WriterEpoch: epoch}
		if attached {
			b.Index, b.PID, b.Size = st.Index, st.PID, st.Size
		}
		s = journal.Sandbox{ID: id, Generation: 1, ContainerID: cid, State: journal.StateReady,
			RootFS: journal.RootFS{Mode: journal.RootFSBlock, Template: "busybox"}, Block: &b}
		return tx.PutSandbox(s)
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (r *watchRig) sandbox(t *testing.T, id string) journal.Sandbox {
	t.Helper()
	var s journal.Sandbox
	if err := r.j.View(func(tx *journal.Tx) (err error) { s, _, err = tx.Sandbox(id); return err }); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestWatchRestartsOnSameDevice: the watch finds a killed root writer,
// journals the next epoch (crash point writer:restarting) and starts a
// writer that re-attaches the same device; nothing is lost.
func TestWatchRestartsOnSameDevice(t *testing.T) {
	r := newWatchRig(t)
	before := r.readyBlock(t, "sb", true)
	if dead := r.w.Dead(context.Background(), before); len(dead) != 0 {
		t.Fatalf("dead writers of a running generation: %q", dead)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.w.Run(ctx) }()
	r.k.KillWriter(before.Block.Dir)
	var s journal.Sandbox
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if s = r.sandbox(t, "sb"); s.Block.Restarts == 1 && s.Block.PID != 0 && s.Block.PID != before.Block.PID {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("writer record %+v after 5 s: want one restart with a new pid", s.Block)
		}
	}
	cancel()
	<-done
	if s.Block.WriterEpoch <= before.Block.WriterEpoch || s.Block.Index != before.Block.Index {
		t.Errorf("restarted writer %+v: want a newer epoch than %d on nbd%d", s.Block, before.Block.WriterEpoch, before.Block.Index)
	}
	st, err := r.k.Blocks().Check(context.Background(), s.Block.Dir)
	if err != nil || st.Epoch != s.Block.WriterEpoch || st.Index != before.Block.Index {
		t.Errorf("the device's writer: %+v (%v), want epoch %d on nbd%d", st, err, s.Block.WriterEpoch, before.Block.Index)
	}
	if spec, ok := r.k.WriterSpec(s.Block.Dir); !ok || !spec.Reattach || spec.Base.Volume != blockstore.Template("busybox") {
		t.Errorf("restart spec %+v: want a re-attach over the template", spec)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.lost) != 0 || len(r.crash) != 1 || r.crash[0] != "writer:restarting" {
		t.Errorf("lost %v, crash points %q: want none lost and one writer:restarting", r.lost, r.crash)
	}
}

// TestWatchLosesWithoutDevice: a dead writer whose device the journal
// never saw cannot be re-attached: the generation goes to the Loser,
// nothing is started.
func TestWatchLosesWithoutDevice(t *testing.T) {
	r := newWatchRig(t)
	before := r.readyBlock(t, "sb", false)
	r.k.KillWriter(before.Block.Dir)
	if dead := r.w.Dead(context.Background(), before); len(dead) != 1 || dead[0] != "" {
		t.Fatalf("dead writers %q: want the root's", dead)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.w.Run(ctx) }()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		r.mu.Lock()
		n := len(r.lost)
		r.mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the generation was not lost within 5 s")
		}
	}
	cancel()
	<-done
	r.mu.Lock()
	defer r.mu.Unlock()
	if !strings.Contains(r.lost[0].Error(), "nothing to re-attach") || len(r.crash) != 0 {
		t.Errorf("lost with %v, crash points %q: want nothing to re-attach and no restart", r.lost[0], r.crash)
	}
	if _, err := r.k.Blocks().Check(context.Background(), before.Block.Dir); !errors.Is(err, writer.ErrNotRunning) {
		t.Errorf("the dead writer's dir: %v, want not running", err)
	}
}
