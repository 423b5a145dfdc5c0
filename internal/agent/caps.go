package agent

import (
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// SetHostnameAndDrop is a warm agent's claim step before the workload
// starts (--hostname-cap): it sets the claim's hostname ("" keeps the
// boot's), then drops CAP_SYS_ADMIN, which the member's spec gave the
// agent for this alone (runsc.Agent.Warm), from the bounding set of every
// thread of the agent: a process it execs from then on (the workload, an
// exec) cannot hold it, whatever user it runs as. It fails closed: an
// agent that cannot drop it starts no workload.
func SetHostnameAndDrop(hostname string) error {
	if hostname != "" {
		if err := unix.Sethostname([]byte(hostname)); err != nil {
			return fmt.Errorf("set hostname %q: %w", hostname, err)
		}
	}
	// AllThreadsSyscall: the bounding set is per thread, and the Go
	// runtime clones new threads from any existing one. (It refuses in a
	// cgo binary; ctl-agent is static, CGO_ENABLED=0.)
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, unix.CAP_SYS_ADMIN, 0); e != 0 {
		return fmt.Errorf("drop CAP_SYS_ADMIN from the bounding set: %w", e)
	}
	if in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, unix.CAP_SYS_ADMIN, 0, 0, 0); err != nil || in != 0 {
		return fmt.Errorf("CAP_SYS_ADMIN still in the bounding set after the drop (%d, %v)", in, err)
	}
	return nil
}
