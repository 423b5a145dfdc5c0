package e2e

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/runsc"
)

// takeOverAgent stages test/e2e/hostileagent in sandbox id, starts it as
// root with mode, frees the real agent's socket name on the host (gVisor
// does not let the guest unlink it) and waits until the hostile one
// answers instead (a stat through it fails).
func takeOverAgent(t *testing.T, e *env, c *api.Client, cx context.Context, id, mode string) {
	t.Helper()
	root := &api.User{}
	f, err := os.Open(ktest.RequireBuilt(t, "e2e-hostileagent"))
	if err != nil {
		t.Fatalf("the hostile agent (vmrun builds it): %v", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WriteFileFrom(cx, id, "/tmp/hostileagent", root, 0o755, f, fi.Size()); err != nil {
		t.Fatalf("stage the hostile agent in the guest: %v", err)
	}
	if err := c.WriteFileFrom(cx, id, "/tmp/mode", root, 0o644, strings.NewReader(mode), int64(len(mode))); err != nil {
		t.Fatalf("write the hostile agent's mode: %v", err)
	}
	// Detached: sh forks setsid (not the group leader), whose shell leaves
	// the agent in a session of its own.
	sock := runsc.AgentSocketDir + "/" + runsc.AgentSocket
	start := fmt.Sprintf(`setsid /bin/sh -c '/tmp/hostileagent %s /tmp/mode &' < /dev/null > /tmp/hostile.log 2>&1; exit $?`, sock)
	if r, err := c.Exec(cx, id, api.ExecRequest{Args: []string{"/bin/sh", "-c", start}, User: root}); err != nil || r.ExitCode != 0 {
		t.Fatalf("start the hostile agent: %+v, %v", r, err)
	}
	sb, err := c.Get(cx, id)
	if err != nil || sb.ContainerID == "" {
		t.Fatalf("get %s: %+v, %v", id, sb, err)
	}
	if err := os.Remove(filepath.Join(e.runDir, "agents", sb.ContainerID, "sock", runsc.AgentSocket)); err != nil {
		t.Fatalf("free the agent's socket name on the host: %v", err)
	}
	waitFor(t, time.Minute, "the hostile agent to take the socket", func() bool {
		_, err := c.StatFile(cx, id, "/", nil)
		return err != nil
	}, func() string {
		var out strings.Builder
		code, err := c.ExecViaRunsc(cx, id, api.ExecRequest{Args: []string{"/bin/sh", "-c", "cat /tmp/hostile.log; ls -la " + runsc.AgentSocketDir}, User: root}, &out, &out)
		return fmt.Sprintf("stat still answered by the real agent; the guest says (%d, %v): %s", code, err, out.String())
	})
}

// memCgroup makes a cgroup of its own for ctld, memory-capped as
// ctld@.service caps it (MemoryHigh below MemoryMax, no swap), and
// returns its directory.
func memCgroup(t *testing.T, high, limit int64) string {
	t.Helper()
	dir := filepath.Join(ktest.CgroupRoot, "ctld-e2e-mem-"+randHex(4))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]int64{"memory.max": limit, "memory.high": high, "memory.swap.max": 0} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(strconv.FormatInt(v, 10)), 0o644); err != nil {
			t.Fatalf("write %s: %v", name, err)
		}
	}
	return dir
}

// TestCtldUnderMemoryMaxWithHostileAgent: ctld runs in a cgroup with a
// small MemoryHigh/MemoryMax (384/512 MiB, where ctld@.service has 3G/4G
// for 32 streams and 32 execs) while a guest agent taken over by its guest
// floods it with everything it controls at once, for a minute: endless
// directory listings of valid 4 KiB-target entries, endless file reads,
// JSON execs and streamed execs of endless output, as many as the
// per-sandbox limits let in. ctld stays under its MemoryMax (never OOM,
// never at max), every flood call fails with a bound, another sandbox's
// execs keep answering throughout, and both releases are clean.
// CTLD_MEMCAP_LIST_BYTES sets ctld's --max-list-bytes (a raised listing
// budget shows the test failing without that bound).
func TestCtldUnderMemoryMaxWithHostileAgent(t *testing.T) {
	const memHigh, memMax = 384 << 20, 512 << 20
	flood := 60 * time.Second
	e := newEnv(t)
	if v := os.Getenv("CTLD_MEMCAP_LIST_BYTES"); v != "" {
		e.args = append(e.args, "--max-list-bytes", v)
		t.Logf("ctld's listing budget raised to %s bytes", v)
	}
	cg := memCgroup(t, memHigh, memMax)
	t.Cleanup(func() {
		// ctld first: the cgroup empties with it.
		e.releaseAll()
		if _, ok := e.procs["a"]; ok {
			e.stop("a")
		}
		if err := os.Remove(cg); err != nil {
			t.Errorf("remove ctld's test cgroup: %v", err)
		}
	})
	e.start("a")
	pid := e.procs["a"].Process.Pid
	// Moved at once, before it took the lock: what it charges from here
	// on (and its runsc commands, its children) is the capped cgroup's.
	if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		t.Fatalf("move ctld into its memory cgroup: %v", err)
	}
	e.waitPrimary("a", 2*time.Minute)
	c := e.client()
	cx := ctx(t, 15*time.Minute)
	for _, id := range []string{"hostile", "calm"} {
		r := claimReq("claim-"+id, 1)
		if id == "hostile" {
			r.Resources.CPUMillis = 1000 // the flood's sender: as fast as the VM lets it
		}
		if _, err := c.Claim(cx, id, r); err != nil {
			t.Fatalf("claim %s: %v", id, err)
		}
	}
	takeOverAgent(t, e, c, cx, "hostile", "flood")

	var peak atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() { // memory.current every 50 ms
		defer close(sampled)
		for {
			if n, err := readCgroupInt(filepath.Join(cg, "memory.current")); err == nil && n > peak.Load() {
				peak.Store(n)
			}
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	type tally struct {
		mu    sync.Mutex
		calls int
		codes map[string]int
	}
	results := map[string]*tally{}
	var wg sync.WaitGroup
	run := func(kind string, n int, call func(context.Context) error) {
		tl := &tally{codes: map[string]int{}}
		results[kind] = tl
		deadline := time.Now().Add(flood)
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(deadline) {
					cctx, cancel := context.WithTimeout(cx, 3*time.Minute)
					err := call(cctx)
					cancel()
					code := "ok"
					if err != nil {
						code = string(codeOf(err))
						if code == "" {
							code = err.Error()
						}
					}
					tl.mu.Lock()
					tl.calls++
					tl.codes[code]++
					tl.mu.Unlock()
					if code == string(errdefs.CodeUnavailable) {
						time.Sleep(200 * time.Millisecond) // a limit's refusal: try again soon
					}
				}
			}()
		}
	}
	run("list", 6, func(cx context.Context) error {
		_, err := c.ListDir(cx, "hostile", "/d", nil)
		return err
	})
	run("read", 2, func(cx context.Context) error {
		_, err := c.ReadFileTo(cx, "hostile", "/big", nil, io.Discard)
		return err
	})
	run("exec json", 4, func(cx context.Context) error {
		r, err := c.Exec(cx, "hostile", api.ExecRequest{Args: []string{"/bin/true"}, TimeoutSec: 10})
		if err == nil && !r.StdoutTruncated {
			return fmt.Errorf("an endless output was not truncated: %d bytes", len(r.Stdout))
		}
		return err
	})
	run("exec stream", 4, func(cx context.Context) error {
		_, err := c.ExecStream(cx, "hostile", api.ExecRequest{Args: []string{"/bin/true"}, TimeoutSec: 10}, io.Discard, io.Discard)
		return err
	})
	// Meanwhile another sandbox is served.
	var calmOK, calmFailed int
	for deadline := time.Now().Add(flood); time.Now().Before(deadline); time.Sleep(2 * time.Second) {
		cctx, cancel := context.WithTimeout(cx, 30*time.Second)
		r, err := c.Exec(cctx, "calm", api.ExecRequest{Args: []string{"/bin/echo", "calm"}})
		cancel()
		if err != nil || strings.TrimSpace(string(r.Stdout)) != "calm" {
			calmFailed++
			t.Errorf("the calm sandbox's exec during the flood: %+v, %v", r, err)
		} else {
			calmOK++
		}
	}
	waitDone := make(chan struct{})
	go func() { wg.Wait(); close(waitDone) }()
	select {
	case <-waitDone:
	case <-time.After(5 * time.Minute):
		t.Fatalf("flood calls still running 5 minutes after the flood ended")
	}
	close(stop)
	<-sampled

	for kind, tl := range results {
		t.Logf("%s: %d calls: %v", kind, tl.calls, tl.codes)
		if tl.codes["ok"] > 0 && kind != "exec json" {
			t.Errorf("%s: %d calls to the flooding agent succeeded", kind, tl.codes["ok"])
		}
	}
	t.Logf("calm execs during the flood: %d answered, %d failed", calmOK, calmFailed)
	kpeak, _ := readCgroupInt(filepath.Join(cg, "memory.peak"))
	ev := func(k string) int64 { return readCgroupKV(filepath.Join(cg, "memory.events"), k) }
	t.Logf("ctld's cgroup: memory.peak %d MiB (sampled %d MiB) of high %d / max %d MiB; events high %d max %d oom %d oom_kill %d; ctld VmHWM %d MiB",
		kpeak>>20, peak.Load()>>20, memHigh>>20, memMax>>20, ev("high"), ev("max"), ev("oom"), ev("oom_kill"), vmHWM(t, pid)>>20)
	if ev("oom") != 0 || ev("oom_kill") != 0 || ev("max") != 0 {
		t.Errorf("ctld's cgroup reached its memory.max: events oom %d, oom_kill %d, max %d", ev("oom"), ev("oom_kill"), ev("max"))
	}
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("ctld is gone after the flood: %v", err)
	}
	if _, err := c.Node(cx); err != nil {
		t.Errorf("ctld's node call after the flood: %v", err)
	}
	for _, id := range []string{"hostile", "calm"} {
		rel, err := c.Release(cx, id, api.ReleaseRequest{OperationID: "release-" + id, Generation: 1})
		if err != nil || !rel.Proof.Clean {
			t.Errorf("release of %s after the flood: %+v, %v", id, rel.Proof, err)
		}
	}
}
