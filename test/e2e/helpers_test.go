// Package e2e drives the real ctld binaries (built by the VM harness into
// $CTLD_BIN_DIR) as root in the test VM: both instances, a real gVisor
// guest, failover and crashes.
package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/ha"
	"github.com/ctld/ctld/internal/ktest"
)

// env is one node: a state dir and run dir shared by slots a and b.
type env struct {
	t        testing.TB
	bin      string
	stateDir string
	runDir   string
	parent   string // cgroup parent of this test's leases
	// nftTable is this env's nft table (inet): ctld never deletes its
	// table, so the test does once both instances stopped.
	nftTable string
	procs    map[string]*exec.Cmd
	// args are added to every `ctld run` of this env (limits, retention).
	args []string
	// wrap, if set, runs each `ctld run` under it (argv prefix that ends
	// by exec-ing the rest, e.g. unshare into namespaces of its own).
	wrap []string
}

// defaultDisk is the default disk lease of the e2e nodes (64 MiB).
func (e *env) defaultDisk() int64 { return 64 << 20 }

func newEnv(t testing.TB) *env {
	t.Helper()
	ktest.RequireCgroup2(t, "cpu", "memory", "pids")
	ktest.RequireBinary(t, "runsc")
	bin := ktest.RequireBuilt(t, "ctld")
	root := t.TempDir()
	// The state dir is on the VM's state disk (XFS with project quotas), as
	// on a host: disk leases are enforced there and fsync is real.
	e := &env{
		t: t, bin: bin, stateDir: filepath.Join(ktest.QuotaDir(t), "state"), runDir: filepath.Join(root, "run"),
		parent: "ctld-e2e-" + randHex(4) + ".slice", procs: map[string]*exec.Cmd{},
		nftTable: "ctld-e2e-" + randHex(4),
	}
	ktest.CheckLeaks(t, ktest.SnapshotOptions{RunscRoots: []string{filepath.Join(e.runDir, "runsc")}, RunDir: e.runDir, StateDir: e.stateDir})
	t.Cleanup(func() {
		e.releaseAll()
		for slot := range e.procs {
			e.stop(slot)
		}
		// The parent is ctld's to create and the operator's to remove.
		if err := os.Remove(filepath.Join(ktest.CgroupRoot, e.parent)); err != nil && !os.IsNotExist(err) {
			t.Errorf("remove cgroup parent: %v", err)
		}
		// So is the nft table (its generations' objects went with them).
		if err := ktest.DeleteNftTable(e.nftTable); err != nil {
			t.Errorf("delete nft table: %v", err)
		}
	})
	return e
}

// useBlock readies e for block-mode claims: it needs NBD, gives ctld a
// writers' cgroup of this env (ctld makes it) and extra args, and once the
// test ends releases what is left (a failed test's writers run in that
// cgroup) and removes the cgroup, before the leak check. It returns the
// cgroup's name (under the cgroup root).
func (e *env) useBlock(extra ...string) string {
	e.t.Helper()
	ktest.RequireNBD(e.t)
	wcg := strings.TrimSuffix(e.parent, ".slice") + "-writers.slice"
	e.args = append(append(e.args, "--writers-cgroup", wcg), extra...)
	e.t.Cleanup(func() {
		e.releaseAll()
		if err := os.Remove(filepath.Join(ktest.CgroupRoot, wcg)); err != nil && !os.IsNotExist(err) {
			e.t.Errorf("remove writers cgroup: %v", err)
		}
	})
	return wcg
}

// releaseAll releases whatever a failed test left running, so one failure
// does not cascade into leaks reported by every later test.
func (e *env) releaseAll() {
	if len(e.procs) == 0 {
		return
	}
	cx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := e.client().List(cx)
	if err != nil {
		return
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for _, s := range l.Sandboxes {
		if s.State != api.StateReady && s.State != api.StateLost {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			cx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			if _, err := e.client().Release(cx, s.ID, api.ReleaseRequest{OperationID: "cleanup-" + s.ContainerID, Generation: s.Generation}); err != nil {
				e.t.Errorf("cleanup release of %s: %v", s.ID, err)
			}
		}()
	}
	wg.Wait()
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// start runs `ctld run --slot slot`, its log in the test's temp dir.
func (e *env) start(slot string, extraEnv ...string) {
	e.t.Helper()
	logPath := filepath.Join(filepath.Dir(e.stateDir), "ctld-"+slot+"-"+randHex(2)+".log")
	lf, err := os.Create(logPath)
	if err != nil {
		e.t.Fatal(err)
	}
	defer lf.Close()
	// A small default disk lease, so the benchmarks' 50 guests fit the
	// VM's 16 GiB state disk.
	argv := append([]string{e.bin, "run", "--slot", slot, "--state-dir", e.stateDir, "--run-dir", e.runDir, "--cgroup-parent", e.parent, "--group", "",
		"--default-disk-bytes", fmt.Sprint(e.defaultDisk()), "--nft-table", e.nftTable}, e.args...)
	argv = append(append([]string(nil), e.wrap...), argv...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), extraEnv...)
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := cmd.Start(); err != nil {
		e.t.Fatalf("start ctld %s: %v", slot, err)
	}
	e.procs[slot] = cmd
	e.t.Cleanup(func() {
		if e.t.Failed() {
			b, _ := os.ReadFile(logPath)
			e.t.Logf("ctld@%s log:\n%s", slot, b)
		}
	})
}

// dumpLogs prints the lines of every instance's log that contain substr.
func (e *env) dumpLogs(substr string) {
	logs, _ := filepath.Glob(filepath.Join(filepath.Dir(e.stateDir), "ctld-*.log"))
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, substr) {
				e.t.Logf("%s: %s", filepath.Base(l), line)
			}
		}
	}
}

// fds lists the targets of an instance's open file descriptors.
func (e *env) fds(slot string) []string {
	e.t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", e.procs[slot].Process.Pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		e.t.Fatalf("list fds of ctld@%s: %v", slot, err)
	}
	var out []string
	for _, ent := range ents {
		target, _ := os.Readlink(filepath.Join(dir, ent.Name()))
		out = append(out, ent.Name()+"->"+target)
	}
	return out
}

// kill9 kills an instance with SIGKILL and reaps it.
func (e *env) kill9(slot string) {
	cmd := e.procs[slot]
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	delete(e.procs, slot)
}

// stop asks an instance to hand over (SIGTERM) and waits for it.
func (e *env) stop(slot string) {
	ktest.StopProcess(e.t, e.procs[slot], "ctld@"+slot, 30*time.Second)
	delete(e.procs, slot)
}

// waitExit waits for an instance that is expected to die by itself.
func (e *env) waitExit(slot string, d time.Duration) {
	e.t.Helper()
	cmd := e.procs[slot]
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		e.t.Fatalf("ctld@%s did not exit within %v", slot, d)
	}
	delete(e.procs, slot)
}

func (e *env) client() *api.Client {
	return &api.Client{SocketPath: filepath.Join(e.runDir, "ctld.sock")}
}

// waitPrimary waits until slot reports primary and the API answers.
func (e *env) waitPrimary(slot string, d time.Duration) api.Node {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for {
		st, err := ha.Probe(ctx, filepath.Join(e.runDir, "ctld-"+slot+".sock"))
		if err == nil && st.Role == ha.RolePrimary && st.Health == "ok" {
			n, err := e.client().Node(ctx)
			if err == nil && n.Slot == slot {
				return n
			}
		}
		select {
		case <-ctx.Done():
			e.t.Fatalf("ctld@%s not serving as primary within %v (last probe: %+v, %v)", slot, d, st, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitRole waits until slot's probe reports role.
func (e *env) waitRole(slot string, role ha.Role, d time.Duration) {
	e.t.Helper()
	deadline := time.Now().Add(d)
	for {
		cx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := ha.Probe(cx, filepath.Join(e.runDir, "ctld-"+slot+".sock"))
		cancel()
		if err == nil && st.Role == role {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("ctld@%s not %s within %v (last probe: %+v, %v)", slot, role, d, st, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func claimReq(op string, gen uint64) api.ClaimRequest {
	return api.ClaimRequest{
		OperationID: op, Generation: gen,
		RootFS:    api.RootFS{Mode: "overlay", Template: "busybox"},
		Resources: api.Resources{CPUMillis: 500, MemoryBytes: 256 << 20, PIDs: 128},
		Network:   api.NetworkPolicy{Mode: "deny_all"},
	}
}

// blockClaimReq is claimReq in block mode running proc, with room for
// the guest's processes: under the ptrace platform each guest process
// has host stub threads in the lease.
func blockClaimReq(op string, gen uint64, proc api.Process) api.ClaimRequest {
	req := claimReq(op, gen)
	req.RootFS.Mode = api.RootFSBlock
	req.Process = proc
	req.Resources.PIDs, req.Resources.MemoryBytes = 1024, 512<<20
	return req
}

// startBlock turns block mode on (useBlock), starts slot a and waits
// until it is primary; it returns the writers' cgroup.
func (e *env) startBlock(extra ...string) string {
	e.t.Helper()
	wcg := e.useBlock(extra...)
	e.start("a")
	e.waitPrimary("a", 2*time.Minute) // the first start imports the busybox template
	return wcg
}

// guestSh runs script with /bin/sh in sandbox id and returns its stdout;
// anything but exit 0 fails the test.
func guestSh(t testing.TB, c *api.Client, id, script string) string {
	t.Helper()
	r, err := c.Exec(ctx(t, 2*time.Minute), id, api.ExecRequest{Args: []string{"/bin/sh", "-c", script}})
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("exec in %s %q: %v, exit %d, stderr %s", id, script, err, r.ExitCode, r.Stderr)
	}
	return string(r.Stdout)
}

func ctx(t testing.TB, d time.Duration) context.Context {
	c, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return c
}

func codeOf(err error) errdefs.Code {
	var ae *errdefs.Error
	if errors.As(err, &ae) {
		return ae.Code
	}
	return ""
}
