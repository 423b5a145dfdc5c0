package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/names"
	"github.com/ctld/ctld/internal/writer"
)

// TestBlockWriterKilledRestarted: kill -9 of a block-mode generation's
// writer process while the runsc guest writes and syncs in a loop. The
// primary notices, journals the next writer epoch and starts a writer
// that re-attaches the same /dev/nbdX: the guest's loop sees no I/O error
// and no gap (the write in flight waits out the request timeout), the
// generation stays ready, GET shows the new writer, and every line synced
// before the kill reads back through the restarted writer (the host's
// page cache dropped first, so clean pages come from the device). Release
// ends with nbd_quiescent and the writers' cgroup removed by ctld.
func TestBlockWriterKilledRestarted(t *testing.T) {
	e := newEnv(t)
	// A short request timeout: the write in flight when the writer died
	// is retried after it (6.1), so the guest's pause is that long.
	wcg := e.startBlock("--writer-request-timeout", "10s")
	c := e.client()

	req := blockClaimReq("c1", 1, api.Process{Args: []string{"/bin/sh", "-c", pageLoop}})
	resp, err := c.Claim(ctx(t, 3*time.Minute), "blk", req)
	if err != nil {
		t.Fatalf("block claim: %v", err)
	}
	cid := names.Generation("blk", 1)
	stateFile := filepath.Join(e.stateDir, "writers", cid, writer.StateName)
	before := readWriterState(t, stateFile)
	if w := resp.Sandbox.Writer; w == nil || w.Epoch != before.Epoch || w.PID != before.PID || w.Device != before.Device || w.Restarts != 0 {
		t.Fatalf("claim's writer %+v, the writer's state %+v", w, before)
	}
	root := filepath.Join(e.stateDir, "blockroot", cid)
	seqOnHost := func() string {
		b, _ := os.ReadFile(filepath.Join(root, "data", "seq"))
		return string(b)
	}
	exec := func(script string) string {
		t.Helper()
		r, err := c.Exec(ctx(t, 2*time.Minute), "blk", api.ExecRequest{Args: []string{"/bin/sh", "-c", script}})
		if err != nil || r.ExitCode != 0 {
			s, gerr := c.Get(ctx(t, time.Minute), "blk")
			t.Fatalf("exec %q: %v, exit %d, stderr %s; sandbox %s (%s) %v; %d lines in seq",
				script, err, r.ExitCode, r.Stderr, s.State, s.Reason, gerr, lines(t, seqOnHost()))
		}
		return string(r.Stdout)
	}
	// The workload makes /data, maybe not yet: ready means it started.
	exec("mkdir -p /data && echo before-kill > /data/hello && sync")
	// Several pages of lines (512 bytes each), so most of the file is
	// clean pages the read-back below takes from the device.
	waitLines(t, seqOnHost, 40)

	synced := lines(t, seqOnHost()) // each line is written, then synced, then the next
	if err := syscall.Kill(before.PID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 writer %d: %v", before.PID, err)
	}
	killed := time.Now()
	var after writer.State
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if b, err := os.ReadFile(stateFile); err == nil && strings.Contains(string(b), `"epoch"`) {
			after = readWriterState(t, stateFile)
			if after.PID != before.PID && after.Epoch > before.Epoch {
				break
			}
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(filepath.Dir(stateFile), writer.LogName))
			t.Fatalf("no new writer a minute after the kill -9; state %+v; writer log:\n%s", after, log)
		}
	}
	restarted := time.Since(killed)
	if after.Index != before.Index {
		t.Fatalf("restarted writer on %s, want the same device %s", after.Device, before.Device)
	}
	n0 := lines(t, seqOnHost())
	waitLines(t, seqOnHost, n0+20) // the guest writes on after the restart
	t.Logf("writer pid %d epoch %d killed after %d synced lines; pid %d epoch %d serves %s %v later; the guest wrote on %v after the kill",
		before.PID, before.Epoch, synced, after.PID, after.Epoch, after.Device, restarted.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))

	s, err := c.Get(ctx(t, time.Minute), "blk")
	if err != nil || s.State != api.StateReady {
		t.Fatalf("after the writer's restart: %s (%s), %v; want ready", s.State, s.Reason, err)
	}
	if w := s.Writer; w == nil || *w != (api.BlockWriter{Epoch: after.Epoch, PID: after.PID, Device: before.Device, Restarts: 1, Base: "templates/busybox@0"}) {
		t.Errorf("GET writer %+v; want epoch %d, pid %d, %s, 1 restart, base templates/busybox@0", w, after.Epoch, after.PID, before.Device)
	}
	if errs := exec("cat /data/err 2>/dev/null; true"); errs != "" {
		t.Errorf("the guest's loop saw I/O errors:\n%s", errs)
	}
	if got := exec("cat /data/hello"); got != "before-kill\n" {
		t.Errorf("/data/hello after the restart: %q", got)
	}
	checkSeq(t, "guest", exec("cat /data/seq"), synced)
	// The host's clean page cache dropped: what the mount reads back now
	// comes through the restarted writer.
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
		t.Fatalf("drop caches: %v", err)
	}
	checkSeq(t, "host after drop_caches", seqOnHost(), synced)

	rel, err := c.Release(ctx(t, 3*time.Minute), "blk", api.ReleaseRequest{OperationID: "r1", Generation: 1})
	if err != nil {
		t.Fatalf("release: %v", err)
	}
	if !rel.Proof.Clean {
		t.Fatalf("release proof not clean: %+v", rel.Proof.Checks)
	}
	for _, ch := range rel.Proof.Checks {
		if ch.Name == "nbd_quiescent" {
			t.Logf("nbd_quiescent: %s", ch.Detail)
		}
	}
	if rel.Sandbox.Writer != nil {
		t.Errorf("released generation still shows a writer: %+v", rel.Sandbox.Writer)
	}
	if _, err := os.Stat(filepath.Join(ktest.CgroupRoot, wcg)); !os.IsNotExist(err) {
		t.Errorf("writers' cgroup %s after the last writer stopped: %v, want ctld to have removed it", wcg, err)
	}
}

// pageLoop is blockWriterLoop with lines of 512 bytes (the counter
// zero-padded), so a few lines fill a page.
const pageLoop = `mkdir -p /data; i=0; while :; do i=$((i+1)); printf '%0511d\n' $i >> /data/seq || echo "write $i" >> /data/err; sync || echo "sync $i" >> /data/err; usleep 20000; done; echo "loop ended" >&2`

// checkSeq: seq is the lines 1..n in order, n >= synced (the last line
// may be cut by a read racing the guest's append).
func checkSeq(t *testing.T, where, seq string, synced int) {
	t.Helper()
	f := strings.Fields(seq)
	for i, v := range f {
		if n, err := strconv.Atoi(v); (err != nil || n != i+1) && i != len(f)-1 {
			t.Fatalf("%s: /data/seq line %d is %q, want %d: a write was lost", where, i+1, v, i+1)
		}
	}
	if len(f) < synced {
		t.Fatalf("%s: /data/seq has %d lines, %d were synced before the kill", where, len(f), synced)
	}
	t.Logf("%s: /data/seq has lines 1..%d in order (%d synced before the kill)", where, len(f), synced)
}
