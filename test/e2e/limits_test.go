package e2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/ktest"
)

// TestConcurrencyLimitsAndExecCharge: with one claim and one exec allowed
// at a time, a second claim or exec while one runs is answered unavailable
// at once with a retry hint; the host-side `runsc exec` process runs in
// the sandbox's lease cgroup (charged to the sandbox), never in ctld's.
func TestConcurrencyLimitsAndExecCharge(t *testing.T) {
	e := newEnv(t)
	e.args = []string{"--max-concurrent-claims=1", "--max-concurrent-execs=1"}
	e.start("a")
	e.waitPrimary("a", 60*time.Second)
	c := e.client()
	cx := ctx(t, 5*time.Minute)
	res, err := c.Claim(cx, "lim1", claimReq("claim-lim1", 1))
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	cid := res.Sandbox.ContainerID
	lease := filepath.Join(ktest.CgroupRoot, e.parent, res.Sandbox.LeaseID)

	// A long exec holds the one exec slot.
	execDone := make(chan error, 1)
	go func() {
		var out bytes.Buffer
		code, err := c.ExecStream(cx, "lim1", api.ExecRequest{Args: []string{"/bin/sleep", "6"}}, &out, &out)
		if err == nil && code != 0 {
			err = fmt.Errorf("exit %d: %s", code, out.String())
		}
		execDone <- err
	}()
	pid := waitRunscExec(t, cid, 30*time.Second)
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatalf("read cgroup of runsc exec %d: %v", pid, err)
	}
	want := "0::/" + e.parent + "/" + res.Sandbox.LeaseID
	if strings.TrimSpace(string(cg)) != want {
		t.Fatalf("runsc exec (pid %d) runs in cgroup %q, want the lease %q", pid, strings.TrimSpace(string(cg)), want)
	}
	procs, _ := os.ReadFile(filepath.Join(lease, "cgroup.procs"))
	if !slices.Contains(strings.Fields(string(procs)), strconv.Itoa(pid)) {
		t.Fatalf("lease cgroup.procs %q lacks runsc exec pid %d", procs, pid)
	}
	ctldCg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", e.procs["a"].Process.Pid))
	pids, _ := os.ReadFile(filepath.Join(lease, "pids.current"))
	t.Logf("runsc exec pid %d in %s (ctld in %s); lease pids.current %s during the exec",
		pid, want, strings.TrimSpace(string(ctldCg)), strings.TrimSpace(string(pids)))

	t0 := time.Now()
	_, err = c.Exec(cx, "lim1", api.ExecRequest{Args: []string{"/bin/true"}})
	if codeOf(err) != errdefs.CodeUnavailable || errdefs.RetryAfterOf(err) < time.Second {
		t.Fatalf("second exec while one runs: %v (retry after %v); want unavailable with a retry hint", err, errdefs.RetryAfterOf(err))
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Fatalf("busy exec answered after %v: it must not queue", d)
	}
	t.Logf("second exec: %v (retry after %v) in %v", err, errdefs.RetryAfterOf(err), time.Since(t0).Round(time.Millisecond))
	if err := <-execDone; err != nil {
		t.Fatalf("long exec: %v", err)
	}
	if r, err := c.Exec(cx, "lim1", api.ExecRequest{Args: []string{"/bin/echo", "again"}}); err != nil || strings.TrimSpace(string(r.Stdout)) != "again" {
		t.Fatalf("exec after the slot freed: %+v, %v", r, err)
	}

	// A claim in flight holds the one claim slot.
	claimDone := make(chan error, 1)
	go func() {
		_, err := c.Claim(cx, "lim2", claimReq("claim-lim2", 1))
		claimDone <- err
	}()
	waitState(t, c, "lim2", api.StateClaiming, 30*time.Second)
	t0 = time.Now()
	_, err = c.Claim(cx, "lim3", claimReq("claim-lim3", 1))
	if codeOf(err) != errdefs.CodeUnavailable || errdefs.RetryAfterOf(err) < time.Second {
		t.Fatalf("second claim while one runs: %v (retry after %v); want unavailable with a retry hint", err, errdefs.RetryAfterOf(err))
	}
	t.Logf("second claim: %v (retry after %v) in %v", err, errdefs.RetryAfterOf(err), time.Since(t0).Round(time.Millisecond))
	if err := <-claimDone; err != nil {
		t.Fatalf("claim lim2: %v", err)
	}
	// The refused claim never reached the journal.
	if _, err := c.Get(cx, "lim3"); codeOf(err) != errdefs.CodeNotFound {
		t.Fatalf("refused claim lim3: %v, want not_found", err)
	}
	for _, id := range []string{"lim1", "lim2"} {
		if _, err := c.Release(cx, id, api.ReleaseRequest{OperationID: "release-" + id, Generation: 1}); err != nil {
			t.Fatalf("release %s: %v", id, err)
		}
	}
}

// waitRunscExec finds the host-side `runsc exec` process of container cid.
func waitRunscExec(t *testing.T, cid string, d time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		ents, _ := os.ReadDir("/proc")
		for _, ent := range ents {
			pid, err := strconv.Atoi(ent.Name())
			if err != nil {
				continue
			}
			b, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "cmdline"))
			if err != nil {
				continue
			}
			argv := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
			if slices.Contains(argv, "exec") && slices.Contains(argv, "--internal-pid-file") && argv[len(argv)-1] == cid {
				return pid
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no runsc exec process for %s within %v", cid, d)
	return 0
}

// waitState waits until sandbox id is in state.
func waitState(t *testing.T, c *api.Client, id string, state api.SandboxState, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if s, err := c.Get(ctx(t, 10*time.Second), id); err == nil && s.State == state {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("sandbox %s not %s within %v", id, state, d)
}
