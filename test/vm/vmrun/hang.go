package main

import (
	"bufio"
	"fmt"
	"net"
	"regexp"
	"strings"
	"time"
)

// lockupRE matches the guest kernel's own report that a CPU stopped
// scheduling: a soft lockup or an RCU stall. Either means the guest will not
// finish on its own, whatever the tests are doing, so the harness acts on the
// first such line instead of waiting for the run's time limit.
var lockupRE = regexp.MustCompile(`soft lockup - CPU#|rcu_(sched|preempt) self-detected stall|rcu: INFO: rcu_(sched|preempt) detected stalls`)

// monitor talks to qemu's human monitor over a Unix socket: it is how the
// harness sees every vCPU's registers and sends sysrq keys to a guest whose
// userspace no longer runs.
type monitor struct{ path string }

// cmd sends one monitor command and returns what qemu printed for it (until
// the next prompt or the deadline).
func (m monitor) cmd(c string, wait time.Duration) (string, error) {
	conn, err := net.DialTimeout("unix", m.path, 2*time.Second)
	if err != nil {
		return "", fmt.Errorf("dial qemu monitor %s: %w", m.path, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(wait))
	r := bufio.NewReader(conn)
	// The banner ends with the first prompt.
	if _, err := readUntilPrompt(r); err != nil {
		return "", fmt.Errorf("read qemu monitor banner: %w", err)
	}
	if _, err := fmt.Fprintf(conn, "%s\n", c); err != nil {
		return "", fmt.Errorf("send %q to qemu monitor: %w", c, err)
	}
	out, err := readUntilPrompt(r)
	if err != nil {
		return out, fmt.Errorf("read answer to %q from qemu monitor: %w", c, err)
	}
	return out, nil
}

func readUntilPrompt(r *bufio.Reader) (string, error) {
	var b strings.Builder
	for {
		line, err := r.ReadString(' ')
		b.WriteString(line)
		if strings.HasSuffix(b.String(), "(qemu) ") {
			return strings.TrimSuffix(b.String(), "(qemu) "), nil
		}
		if err != nil {
			return b.String(), err
		}
	}
}

// dumpGuest prints what a hung guest was doing: qemu's view of every vCPU
// (works even when the guest kernel cannot run), then the guest kernel's
// backtraces of all CPUs (sysrq-l), blocked tasks (sysrq-w) and all tasks
// (sysrq-t), which arrive on the serial console. The sysrq keys go through
// the emulated keyboard, so they work while userspace is stuck.
func dumpGuest(m monitor, why string, settle time.Duration, syms symtab) {
	fmt.Printf("vmrun: %s: dumping every CPU and task of the guest\n", why)
	for _, c := range []string{"info cpus", "info registers -a"} {
		out, err := m.cmd(c, 5*time.Second)
		if err != nil {
			fmt.Printf("vmrun: qemu monitor: %v\n", err)
			return
		}
		out = cleanMonitor(out)
		fmt.Printf("vmrun: qemu monitor %q:\n    %s\n", c, strings.ReplaceAll(out, "\n", "\n    "))
		if c == "info registers -a" {
			for _, l := range vcpuSummary(out, syms) {
				fmt.Printf("vmrun: %s\n", l)
			}
		}
	}
	// sysrq-9 first: the task dumps print at KERN_INFO, below the console's
	// loglevel 5.
	for _, k := range []string{"9", "l", "w", "t"} {
		if _, err := m.cmd("sendkey alt-sysrq-"+k, 5*time.Second); err != nil {
			fmt.Printf("vmrun: qemu monitor: %v\n", err)
			return
		}
		// Let the guest print before the next dump starts.
		time.Sleep(settle)
	}
}

// cleanMonitor drops the echo of the command and the terminal escapes qemu's
// readline adds.
func cleanMonitor(s string) string {
	s = regexp.MustCompile(`\x1b\[[0-9;]*[A-Za-z]`).ReplaceAllString(s, "")
	if i := strings.Index(s, "\n"); i >= 0 {
		s = s[i+1:]
	}
	return strings.TrimRight(strings.ReplaceAll(s, "\r", ""), "\n")
}
