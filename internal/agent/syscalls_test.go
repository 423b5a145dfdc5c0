package agent_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/agent/client"
)

// TestExecSyscallBudget counts, with strace, the descriptor syscalls the
// agent makes per exec of /bin/true (its own threads, not the child's).
// Under gVisor's ptrace platform every one of them is a trap into the
// sentry: about 1 ms each in the test VM under TCG, where an exec through
// the agent cost ~250 ms (docs/architecture.md, Guest agent). os.Pipe
// registered both ends of each of the three pipes with the poller and Fd
// set the child's ends back to blocking: 18 fcntl and 14 epoll_ctl per
// exec (with the connection's two); now each pipe costs one fcntl to make
// our end non-blocking and one (os.NewFile's check) to see it, and one
// epoll_ctl add and delete for our end only.
func TestExecSyscallBudget(t *testing.T) {
	st, err := exec.LookPath("strace")
	if err != nil {
		t.Skip("no strace on this host (test/vm/setup.sh installs it)")
	}
	out := filepath.Join(t.TempDir(), "strace.out")
	a := startAgentUnder(t, []string{st, "-f", "-qq", "-o", out, "-e", "trace=pipe2,fcntl,epoll_ctl,kill,clone,clone3"})
	// strace detaches on SIGTERM and leaves its tracee running: end the
	// agent itself first (cleanups run last-in first-out).
	t.Cleanup(func() {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", a.cmd.Process.Pid, a.cmd.Process.Pid))
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				syscall.Kill(pid, syscall.SIGTERM)
			}
		}
	})
	ex := func() {
		e, err := a.c.Exec(ctxT(t, 30*time.Second), client.ExecRequest{Args: []string{"/bin/true"}}, client.Streams{})
		if err != nil || e.Code != 0 {
			t.Fatalf("exec /bin/true: %+v, %v", e, err)
		}
	}
	ex() // warm: the agent's threads and lazily opened files
	time.Sleep(200 * time.Millisecond)
	before := readFile(t, out)
	const n = 10
	for range n {
		ex()
	}
	time.Sleep(200 * time.Millisecond)
	lines := strings.Split(readFile(t, out)[len(before):], "\n")
	// The children: clone without CLONE_THREAD returned their pids; what
	// they call before exec is Go's fork path in the child, not ours.
	child := map[string]bool{}
	re := regexp.MustCompile(`^(\d+) +(\w+)\((.*)\) += (\d+)`)
	for _, l := range lines {
		if m := re.FindStringSubmatch(l); m != nil && strings.HasPrefix(m[2], "clone") && !strings.Contains(m[3], "CLONE_THREAD") {
			child[m[4]] = true
		}
	}
	count := map[string]int{}
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) < 2 || child[f[0]] {
			continue
		}
		if i := strings.IndexByte(f[1], '('); i > 0 {
			count[f[1][:i]]++
		}
	}
	t.Logf("agent syscalls per exec of /bin/true (n=%d): %v", n, count)
	for name, max := range map[string]int{"fcntl": 6, "epoll_ctl": 6 + 2, "pipe2": 3 + 1, "kill": 1} {
		if got := float64(count[name]) / n; got > float64(max) {
			t.Errorf("%s: %.1f per exec, budget %d", name, got, max)
		}
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
