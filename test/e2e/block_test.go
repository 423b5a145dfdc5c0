package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/ha"
	"github.com/ctld/ctld/internal/names"
	"github.com/ctld/ctld/internal/writer"
)

// blockWriterLoop is the guest's main process: it appends a counter to
// /data/seq and syncs after each line, logging any failed write or sync
// to /data/err, until it is killed.
const blockWriterLoop = `mkdir -p /data; i=0; while :; do i=$((i+1)); echo $i >> /data/seq || echo "write $i" >> /data/err; sync || echo "sync $i" >> /data/err; usleep 20000; done; echo "loop ended" >&2`

// TestBlockClaimSurvivesPrimaryKill: a block-mode claim of the busybox
// template ctld imported into its block store runs a runsc guest whose
// root is the ext4 of a /dev/nbdX served by a writer process. kill -9 of
// the primary while the guest writes and syncs in a loop: the standby
// takes over, adopts the same writer (same pid, the generation stays
// ready), the guest's loop sees no I/O error and its sequence has no gap,
// a file synced before the kill reads back. Release then ends with a
// clean proof (nbd_quiescent) and no NBD device connected (the leak check).
func TestBlockClaimSurvivesPrimaryKill(t *testing.T) {
	e := newEnv(t)
	e.useBlock()
	e.start("a")
	e.waitPrimary("a", 2*time.Minute) // the first start imports the busybox template
	e.start("b")
	e.waitRole("b", ha.RoleStandby, 30*time.Second)
	c := e.client()

	// An overlay claim first, for the node-prep comparison.
	ov, err := c.Claim(ctx(t, 3*time.Minute), "ov", claimReq("ov1", 1))
	if err != nil {
		t.Fatalf("overlay claim: %v", err)
	}
	if _, err := c.Release(ctx(t, 2*time.Minute), "ov", api.ReleaseRequest{OperationID: "ovr1", Generation: 1}); err != nil {
		t.Fatalf("overlay release: %v", err)
	}

	req := blockClaimReq("c1", 1, api.Process{Args: []string{"/bin/sh", "-c", blockWriterLoop}})
	resp, err := c.Claim(ctx(t, 3*time.Minute), "blk", req)
	if err != nil {
		t.Fatalf("block claim: %v", err)
	}
	logTimings(t, "overlay", ov.Sandbox.Timings)
	logTimings(t, "block", resp.Sandbox.Timings)
	if resp.Sandbox.Resources.DiskBytes != 64<<20 {
		t.Errorf("block disk lease %d, want the template's device size %d", resp.Sandbox.Resources.DiskBytes, 64<<20)
	}
	cid := names.Generation("blk", 1)
	stateFile := filepath.Join(e.stateDir, "writers", cid, writer.StateName)
	before := readWriterState(t, stateFile)
	if !strings.HasPrefix(before.Device, "/dev/nbd") || before.PID == 0 {
		t.Fatalf("writer state %+v", before)
	}
	root := filepath.Join(e.stateDir, "blockroot", cid)
	exec := func(script string) string {
		t.Helper()
		r, err := c.Exec(ctx(t, 2*time.Minute), "blk", api.ExecRequest{Args: []string{"/bin/sh", "-c", script}})
		if err != nil || r.ExitCode != 0 {
			s, gerr := c.Get(ctx(t, time.Minute), "blk")
			initLog, _ := os.ReadFile(filepath.Join(e.runDir, "runsc.logs", cid, "init.log"))
			n, _ := os.ReadFile(filepath.Join(root, "data", "seq"))
			t.Fatalf("exec %q: %v, exit %d, stderr %s; sandbox %s (%s) oom kills %d %v; guest output %q; %d lines in seq",
				script, err, r.ExitCode, r.Stderr, s.State, s.Reason, s.OOMKills, gerr, initLog, lines(t, string(n)))
		}
		return string(r.Stdout)
	}
	// What the guest synced is read on the host through the same mount:
	// cheaper than an exec per look under emulation.
	seqOnHost := func() string {
		b, _ := os.ReadFile(filepath.Join(root, "data", "seq"))
		return string(b)
	}
	// The root is the block device's ext4, not an overlay.
	if out := exec("cat /proc/mounts; df -k /"); !strings.Contains(out, "/") {
		t.Logf("guest mounts: %s", out)
	}
	exec("echo before-kill > /data/hello && sync")
	waitLines(t, seqOnHost, 25)

	e.kill9("a")
	took := time.Now()
	e.waitPrimary("b", time.Minute)
	t.Logf("standby primary %v after the kill", time.Since(took).Round(time.Millisecond))
	n0 := lines(t, seqOnHost())
	waitLines(t, seqOnHost, n0+25) // the guest keeps writing after the takeover

	s, err := c.Get(ctx(t, time.Minute), "blk")
	if err != nil || s.State != api.StateReady {
		t.Fatalf("after takeover: %+v, %v; want ready (writer adopted)", s.State, err)
	}
	after := readWriterState(t, stateFile)
	if after.PID != before.PID || after.Epoch != before.Epoch || after.Index != before.Index {
		t.Errorf("writer after takeover %+v, before %+v: want the same process, epoch and device", after, before)
	}
	if got := exec("cat /data/hello"); got != "before-kill\n" {
		t.Errorf("/data/hello after the takeover: %q", got)
	}
	if errs := exec("cat /data/err 2>/dev/null; true"); errs != "" {
		t.Errorf("the guest's loop saw I/O errors:\n%s", errs)
	}
	seq := strings.Fields(exec("cat /data/seq"))
	for i, v := range seq {
		if n, err := strconv.Atoi(v); err != nil || n != i+1 {
			// The last line may be cut mid-write by the cat; any other gap is data lost.
			if i != len(seq)-1 {
				t.Fatalf("/data/seq line %d is %q, want %d: a write was lost", i+1, v, i+1)
			}
		}
	}
	t.Logf("the guest wrote and synced %d lines, %d after the takeover, no error", len(seq), len(seq)-n0)

	rel, err := c.Release(ctx(t, 3*time.Minute), "blk", api.ReleaseRequest{OperationID: "r1", Generation: 1})
	if err != nil {
		t.Fatalf("release: %v", err)
	}
	if !rel.Proof.Clean {
		t.Fatalf("release proof not clean: %+v", rel.Proof.Checks)
	}
	var quiet bool
	for _, ch := range rel.Proof.Checks {
		if ch.Name == "nbd_quiescent" {
			quiet = ch.OK
			t.Logf("nbd_quiescent: %s", ch.Detail)
		}
	}
	if !quiet {
		t.Errorf("proof has no passing nbd_quiescent check: %+v", rel.Proof.Checks)
	}
	if _, err := os.Stat(filepath.Dir(stateFile)); !os.IsNotExist(err) {
		t.Errorf("writer dir left after release: %v", err)
	}
	if rs := rel.Sandbox.ReleaseTimings; rs != nil {
		t.Logf("block release: total %.1f ms, steps %+v", rs.TotalMS, rs.Steps)
	}
	// The writer left the template's chunks it read in the node's base
	// cache (this boot's), for the next claim's writer to read.
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(e.stateDir, "basecache", strings.TrimSpace(string(boot)), string(blockstore.KindTemplate), "busybox", "0-65536x1024")
	var blocks int64
	for k := range 16 {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(dir, "data."+strconv.Itoa(k)), &st); err != nil {
			t.Fatalf("base cache: %v", err)
		}
		blocks += st.Blocks
	}
	if blocks == 0 {
		t.Errorf("base cache %s holds nothing; want the chunks the guest read", dir)
	}
	t.Logf("base cache of template busybox: %d KiB", blocks/2)
}

func logTimings(t *testing.T, what string, tm api.Timings) {
	t.Helper()
	prep := tm.TotalMS - tm.RunscMS - tm.ProofMS
	t.Logf("%s claim: total %.1f ms, node prep %.1f ms (rootfs %.1f, lease %.1f, network %.1f), runsc %.1f, proof %.1f; steps %+v",
		what, tm.TotalMS, prep, tm.RootFSMS, tm.LeaseMS, tm.NetworkMS, tm.RunscMS, tm.ProofMS, tm.Steps)
}

func readWriterState(t *testing.T, p string) writer.State {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("writer state: %v", err)
	}
	var st writer.State
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatalf("writer state %s: %v", p, err)
	}
	return st
}

func lines(t *testing.T, s string) int {
	t.Helper()
	return len(strings.Fields(s))
}

// waitLines waits until the guest's /data/seq has at least n lines.
func waitLines(t *testing.T, seq func() string, n int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		got := lines(t, seq())
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the guest wrote %d lines, want %d", got, n)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
