package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/ha"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/manager"
	"github.com/ctld/ctld/internal/nodechannel/channeltest"
	"github.com/ctld/ctld/internal/pgtest"
)

// isolatedCtld is one node of a fleet in one VM: a real ctld with its own
// state dir, run dir, cgroup parent, nft table, address pool and disk
// projects, in a network and mount namespace of its own (two ctlds in one
// namespace would take each other's ctl-* links and /run/netns/ctld-*
// namespaces for orphans). Its API socket is a file, reached from the
// test's namespaces.
type isolatedCtld struct {
	socket string
	cmd    *exec.Cmd
}

// startIsolatedCtld starts node i; extra are more `ctld run` flags.
func startIsolatedCtld(t *testing.T, i int, extra ...string) *isolatedCtld {
	t.Helper()
	bin := ktest.RequireBuilt(t, "ctld")
	root := t.TempDir()
	stateDir, runDir := filepath.Join(ktest.QuotaDir(t), "state"), filepath.Join(root, "run")
	parent := fmt.Sprintf("ctlm-fleet-%d.slice", i)
	table := fmt.Sprintf("ctlm-fleet-%d", i)
	ktest.CheckLeaks(t, ktest.SnapshotOptions{RunscRoots: []string{filepath.Join(runDir, "runsc")}, RunDir: runDir, StateDir: stateDir})
	t.Cleanup(func() {
		if err := os.Remove(filepath.Join(ktest.CgroupRoot, parent)); err != nil && !os.IsNotExist(err) {
			t.Errorf("remove cgroup parent: %v", err)
		}
	})
	logPath := filepath.Join(root, "ctld.log")
	lf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	// unshare execs sh, which execs ctld: the process is ctld itself.
	script := `set -e; mkdir -p /run/netns; mount -t tmpfs -o mode=0755 tmpfs /run/netns; ip link set lo up; exec "$@"`
	cmd := exec.Command("unshare", "--net", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, "sh",
		bin, "run", "--slot", "a", "--state-dir", stateDir, "--run-dir", runDir, "--cgroup-parent", parent, "--group", "",
		"--nft-table", table, "--net-pool-v4", fmt.Sprintf("10.%d.0.0/16", 210+i),
		"--disk-project-base", fmt.Sprint(1<<24+(i+1)*(1<<20)))
	cmd.Args = append(cmd.Args, extra...)
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start ctld %d: %v", i, err)
	}
	c := &isolatedCtld{socket: filepath.Join(runDir, "ctld.sock"), cmd: cmd}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		ktest.StopProcess(t, cmd, "ctld", 30*time.Second)
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("ctld %d log:\n%s", i, b)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		st, perr := ha.Probe(ctx, filepath.Join(runDir, "ctld-a.sock"))
		if perr == nil && st.Role == ha.RolePrimary && st.Health == "ok" {
			if _, err := (&api.Client{SocketPath: c.socket}).Node(ctx); err == nil {
				// Guests outlive ctld: whatever a failed test left running
				// is released before ctld stops (cleanups run last first).
				t.Cleanup(func() { releaseAll(t, c.socket) })
				return c
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("ctld %d not serving as primary within 60s (last probe: %+v, %v)", i, st, perr)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// startFleetNode starts node i of a fleet on e's database: its isolated
// ctld (ctldArgs: more `ctld run` flags) and its `node run` process with
// a channel certificate of ca (nodeArgs: more `node run` flags, its TTL
// and grace). It returns the ctld, its node id and the node process.
func (e *env) startFleetNode(ctx context.Context, ca *channeltest.CA, i int, ctldArgs []string, nodeArgs ...string) (*isolatedCtld, string, *serveChild) {
	t := e.t
	t.Helper()
	c := startIsolatedCtld(t, i, ctldArgs...)
	n, err := (&api.Client{SocketPath: c.socket}).Node(ctx)
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"--socket", c.socket, "--db", e.db, "node", "run", "--template", "busybox", "--poll", "200ms", "--channel-listen", "127.0.0.1:0"}, nodeArgs...)
	return c, n.NodeID, e.startChild(append(args, channelArgs(ca.Issue(t, n.NodeID, true))...)...)
}

// fleetOwner gives team-a a key (returned) and room for any test's
// creates, and takes the ctld socket away from e: in a fleet only the
// node processes call a ctld.
func (e *env) fleetOwner() string {
	key := strings.TrimSpace(e.ok("key", "create", "--owner", "team-a"))
	e.ok("owner", "quota", "set", "team-a", "--sandboxes", "10000", "--cpu", "10000", "--memory", "10000Gi", "--creates-per-min", "100000")
	e.socket = "/nonexistent/ctld.sock"
	return key
}

// startFleetReplica starts a `serve --fleet` replica on e's database with
// a channel certificate of ca (args: more `serve` flags), and a client of
// key's on it.
func (e *env) startFleetReplica(ca *channeltest.CA, key string, args ...string) (*serveChild, *client.Client) {
	e.t.Helper()
	r := e.startServeChild("127.0.0.1:0", append(append([]string{"--fleet", "--default-timeout", "0"}, args...),
		channelArgs(ca.Issue(e.t, "manager", false))...)...)
	return r, &client.Client{BaseURL: "http://" + r.addr, Key: key}
}

// fleetStore opens the test's own view of e's database (closed by the
// test's cleanup) once nodes nodes are registered, ready, with a channel.
func (e *env) fleetStore(ctx context.Context, nodes int) *manager.Store {
	t := e.t
	t.Helper()
	st, err := manager.Open(ctx, e.db, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		ns, err := st.FleetNodes(ctx)
		ready := 0
		for _, n := range ns {
			if n.State == manager.NodeReady && n.Channel != "" {
				ready++
			}
		}
		if err == nil && ready == nodes {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d nodes registered in 1m: %v", ready, nodes, err)
		}
	}
}

// TestKernelFleetTwoNodesLostAndBack: two nodes (real ctlds, each with
// its node process), one `serve --fleet` replica and PostgreSQL in one VM.
// Two creates land one on each node, each running on the ctld the
// database names; exec reaches each through its node channel. Then one
// whole node (ctld and node process) is SIGSTOPped past its grace: the
// other node's process marks it lost, its overlay sandbox fails with the
// reason, and a new create lands on the live node. After SIGCONT the
// stopped node's process registers again and releases on its ctld the
// generation the database failed, with a proof verified against its
// pinned key: its capacity comes back and its ctld leases nothing.
func TestKernelFleetTwoNodesLostAndBack(t *testing.T) {
	ktest.RequireCgroup2(t, "cpu", "memory", "pids")
	ktest.RequireBinary(t, "runsc")
	ktest.RequireBinary(t, "unshare")
	began := time.Now()
	ctx := context.Background()
	srv := pgtest.Start(t)
	e := &env{t: t, db: srv.NewDatabase(t)}
	ca := channeltest.NewCA(t, "cluster")
	var ctlds [2]*isolatedCtld
	var procs [2]*serveChild
	var ids [2]string
	for i := range ctlds {
		ctlds[i], ids[i], procs[i] = e.startFleetNode(ctx, ca, i, nil, "--ttl", "3s", "--grace", "3s")
	}
	if ids[0] == ids[1] {
		t.Fatalf("both ctlds are node %s", ids[0])
	}
	r, c := e.startFleetReplica(ca, e.fleetOwner(), "--template", "busybox", "--create-timeout", "3m")
	defer func() {
		if t.Failed() {
			t.Logf("replica:\n%s\nnode process 0:\n%s\nnode process 1:\n%s", r.stderr(), procs[0].stderr(), procs[1].stderr())
		}
	}()
	st := e.fleetStore(ctx, 2)
	nodeOf := map[string]int{ids[0]: 0, ids[1]: 1}
	ctldClient := func(i int) *api.Client { return &api.Client{SocketPath: ctlds[i].socket} }

	// One create per node (placement spreads them), at once.
	var wg sync.WaitGroup
	var made [2]client.Sandbox
	for i := range made {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := c.Create(ctx, client.CreateRequest{Template: "busybox"})
			if err != nil || sb.State != client.StateReady {
				t.Errorf("create %d: %+v, %v", i, sb, err)
			}
			made[i] = sb
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	where := map[string]int{}
	for _, sb := range made {
		rec, err := st.Sandbox(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		i := nodeOf[rec.NodeID]
		where[sb.ID] = i
		for j := range ctlds {
			got, err := ctldClient(j).Get(ctx, sb.ID)
			if on := err == nil && got.State == api.StateReady; on != (i == j) {
				t.Fatalf("%s placed on node %d; on ctld %d: %+v, %v", sb.ID, i, j, got, err)
			}
		}
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Args: []string{"/bin/hostname"}})
		if err != nil || strings.TrimSpace(string(res.Stdout)) != sb.ID {
			t.Fatalf("exec in %s through node %d's channel: %+v, %v", sb.ID, i, res, err)
		}
	}
	if where[made[0].ID] == where[made[1].ID] {
		t.Fatalf("both sandboxes on node %d", where[made[0].ID])
	}
	victim := made[0]
	v := where[victim.ID]
	survivor := made[1]

	// The whole node stops past its grace. A failure before SIGCONT must
	// not leave it stopped: the cleanups that release its sandboxes would
	// wait on it for ever (cleanups run last registered first).
	for _, p := range []*os.Process{ctlds[v].cmd.Process, procs[v].cmd.Process} {
		t.Cleanup(func() { p.Signal(syscall.SIGCONT) })
		if err := p.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}
	stopped := time.Now()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		sb, err := c.Get(ctx, victim.ID)
		reason, _ := st.SandboxReason(ctx, victim.ID)
		if err == nil && sb.State == client.StateFailed && strings.Contains(reason, "lost") {
			t.Logf("node %d's sandbox failed %v after its SIGSTOP: %s", v, time.Since(stopped).Round(time.Millisecond), reason)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stopped node's sandbox: %+v, %v", sb, err)
		}
	}
	third, err := c.Create(ctx, client.CreateRequest{Template: "busybox"})
	if err != nil || third.State != client.StateReady {
		t.Fatalf("create while a node is lost: %+v, %v", third, err)
	}
	if rec, _ := st.Sandbox(ctx, third.ID); rec.NodeID != ids[1-v] {
		t.Fatalf("create while node %d is lost placed on %s", v, rec.NodeID)
	}

	// Back: the node releases what the database failed, with a proof.
	for _, p := range []*os.Process{ctlds[v].cmd.Process, procs[v].cmd.Process} {
		if err := p.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		n, err := st.FleetNode(ctx, ids[v])
		if err == nil && n.State == manager.NodeReady && n.Reserved == (manager.NodeAlloc{}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %d after SIGCONT: %+v, %v", v, n, err)
		}
	}
	if got, err := ctldClient(v).Get(ctx, victim.ID); err != nil || got.State != api.StateReleased {
		t.Fatalf("the failed sandbox on its ctld after the node came back: %+v, %v", got, err)
	}
	res, err := st.Reservations(ctx, ids[v])
	if err != nil || len(res) != 1 || res[0].ReleaseOperation == "" {
		t.Fatalf("node %d's reservations: %+v, %v", v, res, err)
	}
	if p, err := st.Proof(ctx, res[0].ReleaseOperation); err != nil || !p.Verified || p.VerifyError != "" {
		t.Fatalf("the returning node's proof: %+v, %v", p, err)
	}
	for _, sb := range []client.Sandbox{survivor, third} {
		d, err := c.Destroy(ctx, sb.ID)
		if err != nil || !d.Proof.Verified || !d.Proof.Clean {
			t.Fatalf("destroy %s: %+v, %v", sb.ID, d, err)
		}
	}
	for i := range ctlds {
		if n, err := ctldClient(i).Node(ctx); err != nil || n.Capacity.Leased.CPUMillis != 0 {
			t.Fatalf("ctld %d still leases %+v, %v", i, n.Capacity.Leased, err)
		}
	}
	t.Logf("two-node scenario took %v", time.Since(began).Round(time.Second))
}

// releaseAll releases every generation ctld at socket still runs.
func releaseAll(t *testing.T, socket string) {
	ctx := context.Background()
	cl := &api.Client{SocketPath: socket}
	l, err := cl.List(ctx)
	if err != nil {
		t.Errorf("list sandboxes to clean up: %v", err)
		return
	}
	for _, sb := range l.Sandboxes {
		if sb.State == api.StateReleased || sb.State == api.StateFailed {
			continue
		}
		if _, err := cl.Release(ctx, sb.ID, api.ReleaseRequest{OperationID: "cleanup-" + sb.ID, Generation: sb.Generation}); err != nil {
			t.Errorf("clean up %s: %v", sb.ID, err)
		}
	}
}
