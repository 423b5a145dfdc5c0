package agent

import (
	"errors"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Reaper is the only waiter for the agent's children. As a guest's init the
// agent inherits every orphan; a plain os/exec Wait would race a
// wait4(-1) that reaps orphans. So every child is started through Start
// (under the lock), and one loop reaps everything: a status of a known pid
// goes to its channel, any other pid was an orphan and is dropped.
type Reaper struct {
	mu      sync.Mutex
	waiters map[int]chan syscall.WaitStatus
}

// NewReaper starts the reaping loop (for the life of the process).
func NewReaper() *Reaper {
	r := &Reaper{waiters: map[int]chan syscall.WaitStatus{}}
	ch := make(chan os.Signal, 16)
	signal.Notify(ch, syscall.SIGCHLD)
	go func() {
		for range ch {
			r.reap()
		}
	}()
	return r
}

func (r *Reaper) reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		// Start holds the lock from fork to registration, so a pid that
		// exits at once is registered by the time we look.
		r.mu.Lock()
		c, ok := r.waiters[pid]
		delete(r.waiters, pid)
		r.mu.Unlock()
		if ok {
			c <- ws
		}
	}
}

// Start starts a process and returns its pid and a channel that receives
// its wait status once.
func (r *Reaper) Start(argv0 string, argv []string, attr *syscall.ProcAttr) (int, <-chan syscall.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := syscall.ForkExec(argv0, argv, attr)
	if err != nil {
		return 0, nil, err
	}
	c := make(chan syscall.WaitStatus, 1)
	r.waiters[pid] = c
	// A SIGCHLD that came before registration was handled by a reap that
	// waits for our lock; nothing is lost.
	return pid, c, nil
}

// exitOf turns a wait status into the wire's exit code and signal.
func exitOf(ws syscall.WaitStatus) (code, sig int) {
	if ws.Signaled() {
		return -1, int(ws.Signal())
	}
	return ws.ExitStatus(), 0
}

// killGroup ends a process group (ESRCH: already gone).
func killGroup(pgid int) {
	if pgid > 1 {
		_ = unix.Kill(-pgid, unix.SIGKILL)
	}
}
