package node

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/ktest"
)

// TestKernelVolumeWriterRestart: on the real kernel, kill -9 of a
// persistent volume's `ctld writer` while the guest appends to a file on
// the volume (and syncs each line): the writers' watch starts the next
// writer on the same /dev/nbdX with a new journaled epoch, the guest's
// loop sees no I/O error, the release seals and publishes the volume's
// head 2, and a later generation reads every line from the volume.
func TestKernelVolumeWriterRestart(t *testing.T) {
	ktest.Require(t)
	store := newRealBlockStore(t)
	k := realVolumeKernel(t, store)
	k.noReuse = true
	// The write in flight when the writer died is retried on the restarted
	// writer after the kernel's request timeout: short here, as in the
	// writer's own tests (the default is 2 min).
	k.blockStore.RequestTimeout = 10 * time.Second
	r := newRig(t, k)
	r.mustBoot()
	r.mustClaim(sb, claimReq("c1", 1))
	ctx, cancel := r.ctx()
	defer cancel()
	before := r.sandbox(sb).Volumes[0]

	const lines = 30
	var out strings.Builder
	looped := make(chan error, 1)
	go func() {
		script := fmt.Sprintf("i=0; while [ $i -lt %d ]; do echo line $i >> /data/log || exit 1; sync || exit 2; i=$((i+1)); sleep 0.2; done", lines)
		code, err := r.n.Exec(ctx, sb, ExecRequest{Args: []string{"/bin/sh", "-c", script}}, &out, &out)
		if err == nil && code != 0 {
			err = fmt.Errorf("exit %d: %s", code, out.String())
		}
		looped <- err
	}()
	wctx, wcancel := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() { defer close(watched); r.n.WatchWriters(wctx) }()
	defer func() { wcancel(); <-watched }()
	time.Sleep(time.Second)
	if err := syscall.Kill(before.PID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill the volume writer %d: %v", before.PID, err)
	}
	killed := time.Now()
	var s journal.Sandbox
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if s = r.sandbox(sb); s.Volumes[0].WriterEpoch > before.WriterEpoch && s.Volumes[0].PID != before.PID {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("volume writer not restarted a minute after its kill: %+v (%s %s)", s.Volumes, s.State, s.Reason)
		}
	}
	t.Logf("volume writer restarted %v after the kill", time.Since(killed).Round(time.Millisecond))
	if av := s.Volumes[0]; s.State != journal.StateReady || av.Index != before.Index || av.Restarts != 1 {
		t.Fatalf("after the restart: %s (%s), attach %+v, before %+v", s.State, s.Reason, av, before)
	}
	if err := <-looped; err != nil {
		t.Fatalf("the guest's writes to the volume: %v", err)
	}
	wcancel()
	<-watched

	r.mustRelease(sb, "r1", 1)
	if d := volumeCheck(t, r, "r1"); !strings.Contains(d, ": published head 2") {
		t.Errorf("volumes_detached: %s", d)
	}
	r.checkClean("after the release")

	r.mustClaim(sb, claimReq("c2", 2))
	got, err := r.n.ReadFile(ctx, sb, "/data/log", 1<<20)
	if n := strings.Count(string(got), "\n"); err != nil || n != lines || !strings.HasSuffix(string(got), fmt.Sprintf("line %d\n", lines-1)) {
		t.Errorf("/data/log in the next generation: %d lines, %v:\n%s", n, err, got)
	}
	r.mustRelease(sb, "r2", 2)
	r.checkClean("at the end")
}
