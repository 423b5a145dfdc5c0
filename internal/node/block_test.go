package node

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/fakekernel"
	"github.com/ctld/ctld/internal/node/writers"
	"github.com/ctld/ctld/internal/writer"
)

// blockReq is a block-mode claim of the fake block store's template.
func blockReq(op string, gen uint64) journal.ClaimRequest {
	req := claimReq(op, gen)
	req.RootFS.Mode, req.Resources.DiskBytes = journal.RootFSBlock, 0
	return req
}

// TestBlockClaimRefusedBeforeJournal: a block claim this node cannot
// serve is refused with a clear 4xx/5xx kind and leaves nothing: no
// record, no operation, no kernel object.
func TestBlockClaimRefusedBeforeJournal(t *testing.T) {
	cases := []struct {
		name  string
		mod   func(*journal.ClaimRequest)
		noBlk bool
		code  errdefs.Code
		want  string
	}{
		{"unknown template", func(r *journal.ClaimRequest) { r.RootFS.Template = "nosuch" }, false, errdefs.CodeNotFound, `block template "nosuch" not found`},
		{"disk bytes not the device size", func(r *journal.ClaimRequest) { r.Resources.DiskBytes = 16 << 20 }, false, errdefs.CodeInvalidArgument, "device size"},
		{"no block subsystems", func(*journal.ClaimRequest) {}, true, errdefs.CodeUnavailable, "no block store"},
		{"unknown volume", func(r *journal.ClaimRequest) { r.Volumes = []journal.VolumeMount{{ID: "data", Path: "/data"}} }, false, errdefs.CodeNotFound, `volume "data" not found`},
		{"volumes without block subsystems", func(r *journal.ClaimRequest) { r.Volumes = []journal.VolumeMount{{ID: "data", Path: "/data"}} }, true, errdefs.CodeUnavailable, "persistent volumes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tk, k := fakeKernel(t)
			if c.noBlk {
				tk.block, tk.blockMounts, tk.templates = nil, nil, nil
			}
			r := newRig(t, tk)
			r.mustBoot()
			k.Calls() // forget the boot's
			req := blockReq("c1", 1)
			c.mod(&req)
			ctx, cancel := r.ctx()
			defer cancel()
			_, err := r.n.Claim(ctx, sb, req)
			if errdefs.CodeOf(err) != c.code || err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("claim: %v; want %s containing %q", err, c.code, c.want)
			}
			if _, err := r.n.sandbox(sb); errdefs.CodeOf(err) != errdefs.CodeNotFound {
				t.Errorf("a refused claim left a sandbox record: %v", err)
			}
			if calls := k.Calls(); len(calls) > 0 {
				t.Errorf("a refused claim touched the kernel: %v", calls)
			}
			r.checkClean("after the refused claim")
		})
	}
}

// TestBlockClaimRelease: a block claim starts a writer with a new epoch
// journaled on the record, mounts its device as the root (no disk
// project: the disk lease is the device size), and its release stops the
// writer and proves the device quiescent. Writer epochs only grow, across
// generations and primaries.
func TestBlockClaimRelease(t *testing.T) {
	tk, k := blockKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	var last uint64
	for gen := uint64(1); gen <= 2; gen++ {
		resp := r.mustClaim(sb, blockReq("c"+string(rune('0'+gen)), gen))
		s := r.sandbox(sb)
		if s.Block == nil || s.Block.WriterEpoch <= last || s.Block.Index < 0 || s.Block.PID == 0 || s.Block.Size != fakekernel.TemplateSize {
			t.Fatalf("generation %d: block record %+v, want a writer epoch above %d, a device, a pid and the template's size", gen, s.Block, last)
		}
		last = s.Block.WriterEpoch
		if s.DiskProject != 0 || resp.Sandbox.Resources.DiskBytes != fakekernel.TemplateSize || !strings.HasSuffix(s.Root, "/blockroot/"+s.ContainerID) {
			t.Errorf("generation %d: disk project %d, disk bytes %d, root %s; want none, the device size, the block root", gen, s.DiskProject, resp.Sandbox.Resources.DiskBytes, s.Root)
		}
		kinds := map[string]bool{}
		for _, st := range resp.Sandbox.Timings.Steps {
			kinds[st.Resource] = true
		}
		if !kinds["writer"] || !kinds["blockmount"] || kinds["mount"] || kinds["disk"] {
			t.Errorf("claim steps %+v: want writer and blockmount, not the overlay's mount and disk", resp.Sandbox.Timings.Steps)
		}
		if text := k.String(); !strings.Contains(text, "blockmount "+s.ContainerID+" from /dev/nbd") || !strings.Contains(text, " alive") {
			t.Errorf("kernel after the claim:\n%s", text)
		}
		r.mustBoot() // a new primary adopts the writer
		if s2 := r.sandbox(sb); s2.State != journal.StateReady {
			t.Fatalf("after takeover: %s (%s), want ready (writer adopted)", s2.State, s2.Reason)
		}
		rop := "r" + string(rune('0'+gen))
		r.mustRelease(sb, rop, gen)
		p := r.checkProof(rop)
		names := map[string]bool{}
		for _, c := range p.Checks {
			names[c.Name] = c.OK
		}
		if !names["nbd_quiescent"] || !names["mounts_gone"] || len(p.Checks) != len(r.n.tableFor(s)) {
			t.Errorf("proof checks %+v: want nbd_quiescent and mounts_gone, one per block entry", p.Checks)
		}
		r.checkClean("after releasing generation " + string(rune('0'+gen)))
	}
	checkUnjournaled(r, crashCase{})
}

// TestBlockWriterDiedRestartedOnTakeover: a ready block generation whose
// writer alone died is not lost on takeover: the next writer, of a new
// epoch journaled before it starts, re-attaches the same device, and the
// generation stays ready (its release proves the device quiescent).
// Crashing after the new epoch is journaled and before the writer starts
// costs one more epoch, not the generation.
func TestBlockWriterDiedRestartedOnTakeover(t *testing.T) {
	tk, k := blockKernel(t)
	r := newRig(t, tk)
	epochAtStart(r)
	r.mustBoot()
	r.mustClaim(sb, blockReq("c1", 1))
	before := r.sandbox(sb)
	k.KillWriter(before.Block.Dir)
	r.arm("writer:restarting")
	if returned, _ := r.boot(); returned {
		t.Fatalf("the takeover did not pass writer:restarting (crash at %q)", r.lastCrash())
	}
	r.mustBoot()
	s := r.sandbox(sb)
	b, b0 := s.Block, before.Block
	if s.State != journal.StateReady || b.Index != b0.Index || b.WriterEpoch != b0.WriterEpoch+2 || b.Restarts != 2 || b.PID == b0.PID {
		t.Fatalf("after takeover: %s (%s), writer %+v; before %+v: want ready, the same device, the epoch 2 higher (one crashed attempt), 2 restarts, a new pid",
			s.State, s.Reason, b, b0)
	}
	if st, err := k.Blocks().Check(context.Background(), b.Dir); err != nil || st.Epoch != b.WriterEpoch || st.PID != b.PID {
		t.Fatalf("writer after takeover: %+v, %v; journal %+v", st, err, b)
	}
	got, err := r.n.Get(context.Background(), sb)
	if err != nil || got.Block == nil || !got.Holds() || *got.Block != *b || b.BaseVolume != "templates/busybox" || b.BaseGeneration != 0 {
		t.Fatalf("GET writer %+v, %v; journal %+v", got.Block, err, b)
	}
	r.mustRelease(sb, "r1", 1)
	r.checkProof("r1")
	r.checkClean("after the release")
	checkUnjournaled(r, crashCase{})
}

// TestBlockWriterRestartFailsIsLost: a dead writer whose restarts keep
// failing is retried RestartAttempts times (an epoch each), then its
// generation is lost, the reason naming the failure, and torn down with
// a clean proof (the dead writer's device disconnected).
func TestBlockWriterRestartFailsIsLost(t *testing.T) {
	tk, k := blockKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	r.mustClaim(sb, blockReq("c1", 1))
	before := r.sandbox(sb)
	k.KillWriter(before.Block.Dir)
	k.FailMake(journal.KindWriter, before.ContainerID, errors.New("no memory for a writer"))
	r.mustBoot()
	s := r.sandbox(sb)
	if s.State != journal.StateReleased || !strings.Contains(s.Reason, "not restarted") || !strings.Contains(s.Reason, "no memory for a writer") {
		t.Fatalf("after takeover: %s (%s), want released as lost, the reason naming the failed restarts", s.State, s.Reason)
	}
	if s.Block.Restarts != DefaultWriterRestarts || s.Block.WriterEpoch != before.Block.WriterEpoch+DefaultWriterRestarts {
		t.Errorf("writer record %+v: want %d restarts, each with its own epoch", s.Block, DefaultWriterRestarts)
	}
	r.checkProof("lost-" + s.ContainerID)
	r.checkClean("after the lost generation")
	checkUnjournaled(r, crashCase{})
}

// TestBlockWriterWatchRestarts: while the primary serves, its watch
// notices a writer's death within CheckEvery and starts the next one on
// the same device; a release right after finds the generation ready and
// proves it clean. A writer that cannot be restarted ends its
// generation as lost without a takeover.
func TestBlockWriterWatchRestarts(t *testing.T) {
	tk, k := blockKernel(t)
	r := newRig(t, tk)
	epochAtStart(r)
	r.mustBoot()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watched := make(chan struct{})
	go func() { defer close(watched); r.n.WatchWriters(ctx) }()
	defer func() { cancel(); <-watched }()

	r.mustClaim(sb, blockReq("c1", 1))
	before := r.sandbox(sb)
	k.KillWriter(before.Block.Dir)
	killed := time.Now()
	s := waitSandbox(t, r, func(s journal.Sandbox) bool {
		return s.Block.WriterEpoch > before.Block.WriterEpoch && s.Block.PID != before.Block.PID
	})
	t.Logf("writer restarted %v after the kill", time.Since(killed).Round(time.Millisecond))
	if s.State != journal.StateReady || s.Block.Index != before.Block.Index || s.Block.Restarts != 1 {
		t.Fatalf("after the restart: %s (%s), writer %+v, before %+v", s.State, s.Reason, s.Block, before.Block)
	}
	r.mustRelease(sb, "r1", 1)
	r.checkProof("r1")
	r.checkClean("after the release")

	r.mustClaim(sb, blockReq("c2", 2))
	s2 := r.sandbox(sb)
	k.FailMake(journal.KindWriter, s2.ContainerID, nil)
	k.KillWriter(s2.Block.Dir)
	s2 = waitSandbox(t, r, func(s journal.Sandbox) bool { return s.State == journal.StateReleased })
	if !strings.Contains(s2.Reason, "not restarted") {
		t.Errorf("lost reason %q", s2.Reason)
	}
	r.checkProof("lost-" + s2.ContainerID)
	r.checkClean("after the lost generation")
}

// waitSandbox polls sb's record until ok says so (5 s).
func waitSandbox(t *testing.T, r *rig, ok func(journal.Sandbox) bool) journal.Sandbox {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		s := r.sandbox(sb)
		if s.Block != nil && ok(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox record %+v (writer %+v): not as wanted after 5 s", s, s.Block)
		}
	}
}

// epochAtStart makes the rig's writers fail the test unless the journal
// already holds the epoch each is started with (journal before effect:
// a crash right after the start must find the writer's epoch).
func epochAtStart(r *rig) {
	r.k.block = epochCheck{r.k.block, r}
}

type epochCheck struct {
	writers.Devices
	r *rig
}

func (e epochCheck) Start(ctx context.Context, spec writer.Spec) (writer.State, error) {
	var s journal.Sandbox
	err := e.r.j.View(func(tx *journal.Tx) (err error) { s, _, err = tx.Sandbox(spec.Sandbox); return err })
	if err != nil || s.Block == nil || s.Block.WriterEpoch != spec.Epoch || s.Block.Dir != spec.Dir {
		e.r.t.Errorf("writer of epoch %d started while the journal has %+v (%v)", spec.Epoch, s.Block, err)
	}
	return e.Devices.Start(ctx, spec)
}

// TestBlockOrphanWriter: a writer no journal names (another node's) is
// stopped by the sweep and its dir removed.
func TestBlockOrphanWriter(t *testing.T) {
	tk, k := blockKernel(t)
	dir := tk.writersDir + "/orph-g1"
	if _, err := k.Blocks().Start(context.Background(), writerSpec(dir)); err != nil {
		t.Fatal(err)
	}
	r := newRig(t, tk)
	r.mustBoot()
	r.checkClean("after the sweep")
	if got := r.allUnjournaled(); len(got) != 1 || got[0] != "writer/"+dir {
		t.Errorf("unjournaled: %v, want the orphan writer", got)
	}
}

func writerSpec(dir string) writer.Spec {
	return writer.Spec{Sandbox: "orph", Generation: 1, Epoch: 7, Dir: dir, Index: -1}
}

// TestBlockWriterRestartOutlivesTerm: the term ends while the watch's
// restart is starting the next writer. The start is not cut short (a
// writer whose start is cancelled is stopped, and one that already
// re-attached would take the device down with it), and the next primary
// adopts that writer: its epoch was journaled before it started.
func TestBlockWriterRestartOutlivesTerm(t *testing.T) {
	tk, k := blockKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	r.mustClaim(sb, blockReq("c1", 1))
	before := r.sandbox(sb)
	endTerm := r.end
	cut := make(chan error, 1)
	r.n.d.Writers.Devices = startHook{r.n.d.Writers.Devices, func(ctx context.Context, spec writer.Spec) {
		if !spec.Reattach {
			return
		}
		endTerm()
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
		cut <- ctx.Err()
	}}
	ctx, cancel := context.WithCancel(context.Background())
	watched := make(chan struct{})
	go func() { defer close(watched); r.n.WatchWriters(ctx) }()
	k.KillWriter(before.Block.Dir)
	select {
	case err := <-cut:
		if err != nil {
			t.Errorf("the restart's start was cut by the end of the term: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no restart within 5 s of the writer's death")
	}
	cancel()
	<-watched
	r.mustBoot()
	s := r.sandbox(sb)
	if s.State != journal.StateReady || s.Block.Restarts != 1 || s.Block.WriterEpoch != before.Block.WriterEpoch+1 {
		t.Fatalf("after takeover: %s (%s), writer %+v; want ready with the writer the last term started", s.State, s.Reason, s.Block)
	}
	r.mustRelease(sb, "r1", 1)
	r.checkClean("after the release")
}

type startHook struct {
	writers.Devices
	hook func(context.Context, writer.Spec)
}

func (h startHook) Start(ctx context.Context, spec writer.Spec) (writer.State, error) {
	h.hook(ctx, spec)
	return h.Devices.Start(ctx, spec)
}

// TestBlockWriterWatchUnsureKeeps: a writer check that fails without
// saying the writer is gone (here: /proc unreadable) restarts nothing
// and loses nothing; the watch looks again on the next tick.
func TestBlockWriterWatchUnsureKeeps(t *testing.T) {
	tk, _ := blockKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	r.mustClaim(sb, blockReq("c1", 1))
	before := r.sandbox(sb)
	var checks atomic.Int64
	r.n.d.Writers.Devices = checkHook{r.n.d.Writers.Devices, func() error {
		checks.Add(1)
		return errors.New("open /proc/locks: too many open files")
	}}
	ctx, cancel := context.WithCancel(context.Background())
	watched := make(chan struct{})
	go func() { defer close(watched); r.n.WatchWriters(ctx) }()
	for deadline := time.Now().Add(5 * time.Second); checks.Load() < 20; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the watch checked %d times in 5 s", checks.Load())
		}
	}
	time.Sleep(3500 * time.Millisecond) // a restart's 3 attempts would be over
	cancel()
	<-watched
	if s := r.sandbox(sb); s.State != journal.StateReady || *s.Block != *before.Block {
		t.Fatalf("after failed checks: %s (%s), writer %+v; want ready with the writer %+v", s.State, s.Reason, s.Block, before.Block)
	}
}

type checkHook struct {
	writers.Devices
	fail func() error
}

func (h checkHook) Check(ctx context.Context, dir string) (writer.State, error) {
	return writer.State{}, h.fail()
}
