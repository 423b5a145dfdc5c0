package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/manager"
	"github.com/ctld/ctld/internal/nodechannel/channeltest"
	"github.com/ctld/ctld/internal/pgtest"
)

// TestKernelFleetBlockTakeover (issue 24): two nodes (real ctlds in
// their own netns/mountns, each with its node process), one `serve
// --fleet` replica and PostgreSQL, and one block store both ctlds share:
// a directory store with one node key (an S3 store would do the same
// through versitygw, but the isolated ctlds' network namespaces do not
// reach the test's loopback, where versitygw listens; a directory is the
// same Store contract, create-only puts included). A block sandbox
// writes a file, pauses (the head is committed) and resumes on some node;
// that whole node is SIGSTOPped past its grace and the sandbox resumes
// on the other node from its head, with the file. Its ctld continued
// alone, the lost generation's pause is refused by the shared store's
// head compare-and-swap (fenced); its node process continued too, the
// node releases the stale generation with a verified clean proof.
// CTLD_FLEET_TAKEOVERS=N (make bench-fleet-takeover) repeats the loss N
// times, back and forth, and prints lost-node-to-ready p50 and max.
func TestKernelFleetBlockTakeover(t *testing.T) {
	ktest.RequireCgroup2(t, "cpu", "memory", "pids")
	ktest.RequireBinary(t, "runsc")
	ktest.RequireBinary(t, "unshare")
	rounds := 1
	if v := os.Getenv("CTLD_FLEET_TAKEOVERS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 50 {
			t.Fatalf("CTLD_FLEET_TAKEOVERS=%q: want 1..50", v)
		}
		rounds = n
	}
	began := time.Now()
	ctx := context.Background()
	srv := pgtest.Start(t)
	e := &env{t: t, db: srv.NewDatabase(t)}
	ca := channeltest.NewCA(t, "cluster")
	shared := t.TempDir()
	var ctlds [2]*isolatedCtld
	var procs [2]*serveChild
	var ids [2]string
	for i := range ctlds {
		writers := fmt.Sprintf("ctlm-fleet-writers-%d.slice", i)
		t.Cleanup(func() {
			if err := os.Remove(filepath.Join(ktest.CgroupRoot, writers)); err != nil && !os.IsNotExist(err) {
				t.Errorf("remove writers cgroup: %v", err)
			}
		})
		// A block claim, seal or release takes seconds to minutes under
		// TCG on a loaded host: a short TTL loses nodes that were only slow.
		ctlds[i], ids[i], procs[i] = e.startFleetNode(ctx, ca, i, []string{"--block-store", filepath.Join(shared, "blockstore"),
			"--node-key", filepath.Join(shared, "blockstore.key"), "--writers-cgroup", writers}, "--ttl", "10s", "--grace", "15s")
	}
	r, c := e.startFleetReplica(ca, e.fleetOwner(), "--template", "busybox:block", "--create-timeout", "6m")
	defer func() {
		if t.Failed() {
			t.Logf("replica:\n%s\nnode process 0:\n%s\nnode process 1:\n%s", r.stderr(), procs[0].stderr(), procs[1].stderr())
		}
	}()
	st := e.fleetStore(ctx, 2)
	t.Logf("both nodes registered (%s, %s), sharing one block store", ids[0], ids[1])
	nodeOf := map[string]int{ids[0]: 0, ids[1]: 1}

	sb, err := c.Create(ctx, client.CreateRequest{Template: "busybox"})
	if err != nil || sb.State != client.StateReady {
		t.Fatalf("create a block sandbox: %+v, %v", sb, err)
	}
	sh := func(cmd string) string {
		t.Helper()
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Args: []string{"/bin/sh", "-c", cmd}})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec %q in %s: %+v, %v", cmd, sb.ID, res, err)
		}
		return string(res.Stdout)
	}
	t.Logf("block sandbox %s ready", sb.ID)
	sh("echo kept > /kept && sync")
	if p, err := c.Pause(ctx, sb.ID); err != nil || p.State != client.StatePaused {
		t.Fatalf("pause: %+v, %v", p, err)
	}
	h, _ := st.Head(ctx, sb.ID)
	t.Logf("wrote /kept and paused: head %d (block generation %d) committed in the shared store", h.Seq, h.Generation)
	if p, err := c.Resume(ctx, sb.ID); err != nil || p.State != client.StateReady {
		t.Fatalf("resume: %+v, %v", p, err)
	}
	// A second block sandbox on the same node never pauses: it has no head
	// when its node is lost, so the takeover forks the template into its
	// volume and publishes that as the first head (the store-side fence of
	// internal/node/blockroot/fence.go). The other node is cordoned while
	// it is created so that both share the node that will be lost.
	np, npGen := createOnNode(ctx, t, st, c, ids, nodeOf, sb.ID)
	if res, err := c.Exec(ctx, np.ID, client.ExecRequest{Args: []string{"/bin/sh", "-c", "echo lost > /uncommitted && sync"}}); err != nil || res.ExitCode != 0 {
		t.Fatalf("write in %s: %+v, %v", np.ID, res, err)
	}
	var took []time.Duration
	for round := 0; round < rounds; round++ {
		rec, err := st.Sandbox(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		v, gen := nodeOf[rec.NodeID], rec.Generation
		t.Logf("round %d: generation %d runs on node %d; SIGSTOP its ctld and node process", round, gen, v)
		ctldV := &api.Client{SocketPath: ctlds[v].socket}
		for _, p := range []*os.Process{ctlds[v].cmd.Process, procs[v].cmd.Process} {
			t.Cleanup(func() { p.Signal(syscall.SIGCONT) })
			if err := p.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
		}
		stopped := time.Now()
		for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
			got, gerr := c.Get(ctx, sb.ID)
			now, rerr := st.Sandbox(ctx, sb.ID)
			if gerr == nil && rerr == nil && got.State == client.StateReady && now.NodeID == ids[1-v] && now.Generation > gen {
				took = append(took, time.Since(stopped))
				reason, _ := st.SandboxReason(ctx, sb.ID)
				t.Logf("round %d: node %d SIGSTOPped; generation %d ready on node %d after %v (%s)", round, v, now.Generation, 1-v, took[round].Round(time.Millisecond), reason)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: waited 5m for %s to be ready on node %d after node %d stopped: %+v, %v / %+v, %v", round, sb.ID, 1-v, v, got, gerr, now, rerr)
			}
		}
		if got := sh("cat /kept"); got != "kept\n" {
			t.Fatalf("round %d: /kept on the new node: %q", round, got)
		}
		t.Logf("round %d: /kept reads %q on node %d", round, "kept", 1-v)
		if round == 0 {
			awaitNeverPausedTakeover(ctx, t, st, c, np.ID, npGen, ids[1-v])
		}

		// The lost node's ctld goes on alone: its generation's pause
		// seals, and the shared store refuses its head.
		if err := ctlds[v].cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		_, perr := ctldV.Pause(pctx, sb.ID, api.PauseRequest{OperationID: fmt.Sprintf("late-%d", round), Generation: gen})
		cancel()
		if errdefs.CodeOf(perr) != errdefs.CodeFenced {
			t.Fatalf("round %d: the lost generation %d's pause on node %d: %v, want fenced by the store's head", round, gen, v, perr)
		}
		t.Logf("round %d: node %d's ctld continued; the lost generation's late pause: %v", round, v, perr)
		if round == 0 {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
			_, perr := ctldV.Pause(pctx, np.ID, api.PauseRequest{OperationID: "late-never-paused", Generation: npGen})
			cancel()
			if errdefs.CodeOf(perr) != errdefs.CodeFenced {
				t.Fatalf("the never-paused sandbox's lost generation %d's pause on node %d: %v, want fenced by the store's head", npGen, v, perr)
			}
			t.Logf("round 0: the never-paused sandbox's lost generation's late pause: %v", perr)
		}
		if err := procs[v].cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
			n, err := st.FleetNode(ctx, ids[v])
			if err == nil && n.State == manager.NodeReady && n.Reserved == (manager.NodeAlloc{}) {
				t.Logf("round %d: node %d's process continued; the node is ready again with nothing reserved", round, v)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: waited 5m for node %d to be ready with nothing reserved after SIGCONT: %+v, %v", round, v, n, err)
			}
		}
		if got, err := ctldV.Get(ctx, sb.ID); err != nil || got.State != api.StateReleased || got.Generation != gen {
			t.Fatalf("round %d: the stale generation on node %d: %+v, %v", round, v, got, err)
		}
		res, err := st.Reservations(ctx, ids[v])
		if err != nil {
			t.Fatal(err)
		}
		verified := 0
		for _, rv := range res {
			if (rv.SandboxID == sb.ID && rv.Generation == gen) || (round == 0 && rv.SandboxID == np.ID && rv.Generation == npGen) {
				p, err := st.Proof(ctx, rv.ReleaseOperation)
				if err != nil || !p.Verified || p.VerifyError != "" {
					t.Fatalf("round %d: the stale generation's proof: %+v, %v", round, p, err)
				}
				verified++
			}
		}
		if want := map[bool]int{true: 2, false: 1}[round == 0]; verified != want {
			t.Fatalf("round %d: reservations of node %d: %+v; want %d stale generations released (%s's %d)", round, v, res, want, sb.ID, gen)
		}
		t.Logf("round %d: node %d released the stale generation %d; its proof verified against the node's pinned key", round, v, gen)
	}
	// The new generation's own pause publishes over the fence.
	if p, err := c.Pause(ctx, sb.ID); err != nil || p.State != client.StatePaused {
		t.Fatalf("pause after the takeover: %+v, %v", p, err)
	}
	for _, id := range []string{sb.ID, np.ID} {
		if d, err := c.Destroy(ctx, id); err != nil || !d.Proof.Verified {
			t.Fatalf("destroy %s: %+v, %v", id, d, err)
		}
	}
	for i := range ctlds {
		if n, err := (&api.Client{SocketPath: ctlds[i].socket}).Node(ctx); err != nil || n.Capacity.Leased.CPUMillis != 0 {
			t.Fatalf("ctld %d still leases %+v, %v", i, n.Capacity.Leased, err)
		}
	}
	slices.Sort(took)
	t.Logf("lost node to its block sandbox ready elsewhere: n=%d p50 %v max %v (all %v)", len(took),
		took[len(took)/2].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond), took)
	t.Logf("block takeover scenario took %v", time.Since(began).Round(time.Second))
}

// createOnNode creates a block sandbox on the node that runs beside
// (the other node cordoned meanwhile) and returns it and its generation.
func createOnNode(ctx context.Context, t *testing.T, st *manager.Store, c *client.Client, ids [2]string, nodeOf map[string]int, beside string) (client.Sandbox, uint64) {
	t.Helper()
	rec, err := st.Sandbox(ctx, beside)
	if err != nil {
		t.Fatal(err)
	}
	other := ids[1-nodeOf[rec.NodeID]]
	if _, err := st.SetNodeState(ctx, other, manager.NodeCordoned); err != nil {
		t.Fatal(err)
	}
	sb, err := c.Create(ctx, client.CreateRequest{Template: "busybox"})
	if _, uerr := st.SetNodeState(ctx, other, manager.NodeReady); uerr != nil {
		t.Fatal(uerr)
	}
	if err != nil || sb.State != client.StateReady {
		t.Fatalf("create the never-paused block sandbox: %+v, %v", sb, err)
	}
	got, err := st.Sandbox(ctx, sb.ID)
	if err != nil || got.NodeID != rec.NodeID {
		t.Fatalf("never-paused sandbox %s placed on %+v, %v; want node %s", sb.ID, got.NodeID, err, rec.NodeID)
	}
	t.Logf("never-paused block sandbox %s ready on %s beside %s", sb.ID, rec.NodeID, beside)
	return sb, got.Generation
}

// awaitNeverPausedTakeover waits for the never-paused sandbox id to be
// ready on node to with a generation after lost, and checks it holds the
// template's files and not what its lost generation never committed.
func awaitNeverPausedTakeover(ctx context.Context, t *testing.T, st *manager.Store, c *client.Client, id string, lost uint64, to string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		got, gerr := c.Get(ctx, id)
		now, rerr := st.Sandbox(ctx, id)
		if gerr == nil && rerr == nil && got.State == client.StateReady && now.NodeID == to && now.Generation > lost {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited 5m for the never-paused %s to be ready on %s: %+v, %v / %+v, %v", id, to, got, gerr, now, rerr)
		}
	}
	res, err := c.Exec(ctx, id, client.ExecRequest{Args: []string{"/bin/sh", "-c", "test -x /bin/busybox && ! test -e /uncommitted && echo template"}})
	if err != nil || res.ExitCode != 0 || string(res.Stdout) != "template\n" {
		t.Fatalf("the never-paused %s on %s: %+v, %v; want the template's files without /uncommitted", id, to, res, err)
	}
	h, err := st.Head(ctx, id)
	if err != nil {
		t.Fatalf("head of the never-paused %s after its takeover: %v", id, err)
	}
	t.Logf("never-paused %s: ready on %s from the template, head %d (block generation %d) published by the takeover", id, to, h.Seq, h.Generation)
}
