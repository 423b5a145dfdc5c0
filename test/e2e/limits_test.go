package e2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/ktest"
)

// TestConcurrencyLimitsAndExecCharge: with one claim and one exec allowed
// at a time, a second claim or exec while one runs is answered unavailable
// at once with a retry hint. (An exec runs in the guest, through its
// agent: charged to the sandbox by construction; the operator's runsc exec
// fallback starts in the lease cgroup, see runsc's kernel tests.)
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
	lease := filepath.Join(ktest.CgroupRoot, e.parent, res.Sandbox.LeaseID)

	// A long exec holds the one exec slot.
	execDone := make(chan error, 1)
	go func() {
		var out bytes.Buffer
		code, err := c.ExecStream(cx, "lim1", api.ExecRequest{Args: []string{"/bin/sh", "-c", "echo yes > /tmp/started; sleep 6"}}, &out, &out)
		if err == nil && code != 0 {
			err = fmt.Errorf("exit %d: %s", code, out.String())
		}
		execDone <- err
	}()
	// The exec runs in the guest (through its agent), so it is the
	// sandbox's by construction: wait until it has started there.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if b, err := c.ReadFile(cx, "lim1", "/tmp/started"); err == nil && string(b) == "yes\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the long exec never started in the guest")
		}
	}
	pids, _ := os.ReadFile(filepath.Join(lease, "pids.current"))
	t.Logf("lease pids.current %s during the exec", strings.TrimSpace(string(pids)))

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
