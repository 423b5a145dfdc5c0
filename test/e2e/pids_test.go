package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/node"
)

// leaseTasks samples the host tasks of every lease under a cgroup parent:
// pids.current counts threads (the sentry's, the gofer's, ptrace's stubs),
// not only processes.
type leaseTasks struct {
	mu    sync.Mutex
	peak  map[string]int64  // lease -> highest pids.current sampled
	shape map[string]string // lease -> tasks per process name at that peak
}

// sample reads every lease's pids.current once.
func (l *leaseTasks) sample(parent string) {
	ents, _ := os.ReadDir(parent)
	for _, ent := range ents {
		if !ent.IsDir() {
			continue
		}
		dir := filepath.Join(parent, ent.Name())
		n, err := readCgroupInt(filepath.Join(dir, "pids.current"))
		if err != nil {
			continue
		}
		l.mu.Lock()
		if n > l.peak[ent.Name()] {
			l.peak[ent.Name()] = n
			l.shape[ent.Name()] = taskShape(dir)
		}
		l.mu.Unlock()
	}
}

// taskShape says how a lease's tasks split by process: "runsc-sandbox:34
// runsc-gofer:9 exe:12", counting each process's threads.
func taskShape(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return err.Error()
	}
	per := map[string]int{}
	for _, pid := range strings.Fields(string(b)) {
		comm, _ := os.ReadFile("/proc/" + pid + "/comm")
		name := strings.TrimSpace(string(comm))
		if args, _ := os.ReadFile("/proc/" + pid + "/cmdline"); strings.Contains(string(args), "\x00boot\x00") {
			name = "sentry"
		} else if strings.Contains(string(args), "\x00gofer\x00") {
			name = "gofer"
		}
		tasks, _ := os.ReadDir("/proc/" + pid + "/task")
		per[name] += len(tasks)
	}
	var out []string
	for k, v := range per {
		out = append(out, fmt.Sprintf("%s:%d", k, v))
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

func readCgroupInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// readCgroupKV reads one key of a flat-keyed cgroup file ("max 3").
func readCgroupKV(path, key string) int64 {
	b, _ := os.ReadFile(path)
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == key {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return -1
}

// TestRuntimePIDsAllowance: a lease's pids.max counts host tasks, and a
// guest's runtime alone (the sentry's and gofer's threads, ptrace's stubs,
// the log shim) holds 54-66 of them when it is ready, more on a loaded
// node (one lease of the failover benchmark's 64 PIDs died silently
// before ready). Four claims of 32 PIDs at once boot with the node's
// allowance: their leases hold 32 + DefaultRuntimePIDs, each peaked above
// its claim's 32 (so without the allowance it could not have booted: with
// --runtime-pids 0 such a claim hung in its boot for 10 minutes in the
// test VM), none had a fork refused, and the node counts the allowance in
// its capacity. It logs each lease's peak (pids.peak) and its split by
// process, and what 8 sleeping guest processes add.
func TestRuntimePIDsAllowance(t *testing.T) {
	res := api.Resources{CPUMillis: 250, MemoryBytes: 128 << 20, PIDs: 32}
	e := newEnv(t)
	e.args = append(e.args, "--ready-timeout", "5m")
	e.start("a")
	e.waitPrimary("a", 2*time.Minute)
	c := e.client()
	parent := filepath.Join(ktest.CgroupRoot, e.parent)
	lt := &leaseTasks{peak: map[string]int64{}, shape: map[string]string{}}
	stop, sampled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			lt.sample(parent)
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	const guests = 4
	leases := make([]string, guests)
	var wg sync.WaitGroup
	for i := range guests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("fit%d", i)
			r := claimReq("claim-"+id, 1)
			r.Resources = res
			s, err := c.Claim(ctx(t, 10*time.Minute), id, r)
			if err != nil {
				t.Errorf("claim %s of %d PIDs with the runtime's allowance: %v", id, res.PIDs, err)
				return
			}
			leases[i] = s.Sandbox.LeaseID
		}()
	}
	wg.Wait()
	close(stop)
	<-sampled
	want := res.PIDs + node.DefaultRuntimePIDs
	for i, l := range leases {
		if l == "" {
			continue
		}
		dir := filepath.Join(parent, l)
		if got, err := readCgroupInt(filepath.Join(dir, "pids.max")); err != nil || got != want {
			t.Errorf("fit%d: pids.max %d (%v), want %d", i, got, err, want)
		}
		peak, _ := readCgroupInt(filepath.Join(dir, "pids.peak"))
		if peak <= res.PIDs {
			t.Errorf("fit%d: pids.peak %d: the runtime fit in the claim's %d PIDs, so the allowance is not what let it boot", i, peak, res.PIDs)
		}
		refused := readCgroupKV(filepath.Join(dir, "pids.events"), "max")
		if refused != 0 {
			t.Errorf("fit%d: %d forks refused at pids.max", i, refused)
		}
		lt.mu.Lock()
		t.Logf("fit%d: pids.peak %d of pids.max %d; sampled peak %d [%s]", i, peak, want, lt.peak[l], lt.shape[l])
		lt.mu.Unlock()
	}
	n, err := c.Node(ctx(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if n.Capacity.Leased.PIDs != guests*want {
		t.Errorf("leased PIDs %d, want %d (%d guests of %d + the runtime's %d)", n.Capacity.Leased.PIDs, guests*want, guests, res.PIDs, node.DefaultRuntimePIDs)
	}
	// What a workload's processes add to the lease (logged only: under
	// ptrace each guest process is a stub process on the host, with a
	// stub thread for each sentry thread that ran it).
	if leases[0] != "" {
		dir := filepath.Join(parent, leases[0])
		before, _ := readCgroupInt(filepath.Join(dir, "pids.current"))
		r, err := c.Exec(ctx(t, 5*time.Minute), "fit0", api.ExecRequest{Args: []string{"/bin/sh", "-c", "for i in 1 2 3 4 5 6 7 8; do sleep 60 </dev/null >/dev/null 2>&1 & done; echo started"}})
		after, _ := readCgroupInt(filepath.Join(dir, "pids.current"))
		t.Logf("fit0: 8 sleeping guest processes: lease tasks %d -> %d [%s] (exec %+v, %v)", before, after, taskShape(dir), r.ExitCode, err)
	}
}
