package e2e

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/proof"
)

// TestWarmClaimThroughTheAPI (issue 27): a real ctld with `--warm-pool
// busybox=1` serves a claim of busybox over its API from the member it
// booted ahead (no runsc create in the claim's timings); the guest is the
// claim's: its hostname, its env and nothing else of the agent's, no
// process but the agent (pid 1), the workload and the exec's own, no file
// left in /tmp by the boot; exec and files work; the pool refills and its
// member's capacity shows as the node's warm row, not as leased; the
// release's proof is clean and verifies against the node's key; then the
// same ctld started without the pool destroys the member on its takeover
// (warm row 0, nothing withheld), and the env's leak check finds nothing.
func TestWarmClaimThroughTheAPI(t *testing.T) {
	e := newEnv(t)
	pool := []string{"--warm-pool", "busybox=1"}
	e.args = append(e.args, pool...)
	e.start("a")
	n0 := e.waitPrimary("a", 2*time.Minute)
	c := e.client()
	full := func(p api.WarmPool) bool { return p.Idle == 1 && p.Booting == 0 }
	waitPool(t, c, "full (one idle member)", full)

	req := claimReq("c-sb1", 1)
	// The workload notes what it sees (gVisor's ptrace scope keeps an
	// exec from reading a sibling's /proc/<pid>/environ or cwd).
	const workload = `echo "$FOO:$(pwd)" > /tmp/seen; env | grep -c ^CTL_AGENT_ >> /tmp/seen; exec sleep 3600`
	req.Process = api.Process{Args: []string{"/bin/sh", "-c", workload}, Env: []string{"FOO=bar"}, Cwd: "/root"}
	res, err := c.Claim(ctx(t, 3*time.Minute), "sb1", req)
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	tm := res.Sandbox.Timings
	if !strings.HasPrefix(res.Sandbox.ContainerID, "warm-") || tm.RunscMS != 0 || res.Sandbox.State != api.StateReady {
		t.Fatalf("claim: container %s, state %s, runsc %.0f ms: want a ready claim of the warm member", res.Sandbox.ContainerID, res.Sandbox.State, tm.RunscMS)
	}
	t.Logf("warm claim timings ms: admit %.1f lease %.1f rootfs %.1f network %.1f proof %.1f total %.1f", tm.AdmitMS, tm.LeaseMS, tm.RootFSMS, tm.NetworkMS, tm.ProofMS, tm.TotalMS)

	if got := strings.TrimSpace(guestSh(t, c, "sb1", "hostname")); got != "sb1" {
		t.Errorf("guest hostname %q, want sb1", got)
	}
	// The claim's env and cwd, none of the agent's settings; /tmp holds
	// the workload's note alone (nothing of the boot).
	var seen, files string
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		files = guestSh(t, c, "sb1", "ls -A /tmp")
		seen = guestSh(t, c, "sb1", "cat /tmp/seen 2>/dev/null; true")
		if strings.Count(seen, "\n") == 2 || time.Now().After(deadline) {
			break
		}
	}
	if seen != "bar:/root\n0\n" || files != "seen\n" {
		t.Errorf("workload saw %q (want \"bar:/root\\n0\\n\": the claim's env and cwd, no CTL_AGENT_*), /tmp holds %q (want seen alone)", seen, files)
	}
	// pid 1 the agent, the workload (exec'd into sleep), and this
	// exec's sh and ps: nothing else runs.
	ps := guestSh(t, c, "sb1", "ps -o comm")
	comms := strings.Fields(ps)[1:]
	slices.Sort(comms)
	if want := []string{"ctl-agent", "ps", "sleep"}; !slices.Equal(comms, want) {
		t.Errorf("guest processes %q, want %q:\n%s", comms, want, ps)
	}
	if err := c.WriteFile(ctx(t, time.Minute), "sb1", "/root/note", []byte("warm")); err != nil {
		t.Fatalf("write file: %v", err)
	}
	if got := guestSh(t, c, "sb1", "cat /root/note"); got != "warm" {
		t.Errorf("guest reads %q, want the file written through the API", got)
	}

	waitPool(t, c, "refilled", full)
	nd, err := c.Node(ctx(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if nd.Capacity.Leased.CPUMillis != req.Resources.CPUMillis || nd.Capacity.Warm.CPUMillis == 0 {
		t.Errorf("capacity beside the claim and a refilled pool: leased %+v warm %+v", nd.Capacity.Leased, nd.Capacity.Warm)
	}
	rel, err := c.Release(ctx(t, 3*time.Minute), "sb1", api.ReleaseRequest{OperationID: "r-sb1", Generation: 1})
	if err != nil {
		t.Fatalf("release: %v", err)
	}
	if !rel.Proof.Clean {
		t.Fatalf("release proof not clean: %+v", rel.Proof.Checks)
	}
	if err := proof.Verify(rel.Proof.Record(), n0.NodeKey); err != nil {
		t.Fatalf("verify the release proof against the node's key: %v", err)
	}

	// The member is destroyed by the next primary that keeps no pool.
	e.restartWithoutPool(pool)
}

// restartWithoutPool stops slot a, starts it again without the pool's
// args and waits until its takeover destroyed every member (warm row 0,
// nothing withheld). None may be booting at the stop: a boot under
// emulation can outlast the stop's grace.
func (e *env) restartWithoutPool(pool []string) {
	e.t.Helper()
	e.stop("a")
	e.args = slices.DeleteFunc(e.args, func(a string) bool { return slices.Contains(pool, a) })
	e.start("a")
	e.waitPrimary("a", 2*time.Minute)
	c := e.client()
	for deadline := time.Now().Add(3 * time.Minute); ; {
		nd, err := c.Node(ctx(e.t, time.Minute))
		if err == nil && nd.Capacity.Warm == (api.Capacity{}) && len(nd.Withheld) == 0 {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("warm members left after a pool-less takeover: %+v, %v", nd.Capacity, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
