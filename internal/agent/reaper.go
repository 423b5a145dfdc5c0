package agent

import (
	"bytes"
	"errors"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

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

// NewReaper makes a reaper; children it starts are reaped once Run was
// called (a child that ends before is reaped then).
func NewReaper() *Reaper {
	return &Reaper{waiters: map[int]chan syscall.WaitStatus{}}
}

// Run starts the reaping loop (for the life of the process). The agent
// calls it once the workload's start is decided, not before: os/signal
// enables each signal through a round trip to a thread of its own (a
// thread creation, then futex hand-offs and a sigprocmask), and under
// gVisor's ptrace platform every one of those syscalls and switches is a
// trap into the sentry; on the readiness path they only delay the answer.
// Until Run, a SIGCHLD is ignored (the runtime's default for it); the
// first reap finds the children that ended meanwhile.
func (r *Reaper) Run() {
	ch := make(chan os.Signal, 16)
	signal.Notify(ch, syscall.SIGCHLD)
	r.reap()
	go func() {
		for range ch {
			r.reap()
		}
	}()
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

// killSession kills the process group of leader and then every other
// process of its session (leader made both: a PTY exec's shell). A shell's
// job control puts background jobs in groups of their own, which the group
// kill misses. A process that called setsid itself has left: that is the
// one deliberate way to outlive an exec. Raw syscalls: under gVisor's
// ptrace platform each is a trap, and os.Open would add the poller's.
func killSession(leader int) {
	if leader <= 1 {
		return
	}
	killGroup(leader)
	// A member forking while it is killed makes no child (the fork fails
	// with the kill pending), but a child forked just before is only seen
	// on the next look: look until none is left alive, boundedly.
	for range 20 {
		pids := sessionMembers("/proc", leader)
		if len(pids) == 0 {
			return
		}
		for _, p := range pids {
			_ = unix.Kill(p, unix.SIGKILL)
		}
		time.Sleep(time.Millisecond)
	}
}

// sessionMembers lists the processes of session sid under procfs root that
// are not zombies (killed ones wait there for the reaper). A process that
// cannot be read has gone meanwhile.
func sessionMembers(root string, sid int) []int {
	d, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	defer unix.Close(d)
	var (
		pids  []int
		dents = make([]byte, 8<<10)
		stat  = make([]byte, 512)
	)
	for {
		n, err := unix.Getdents(d, dents)
		if err != nil || n <= 0 {
			return pids
		}
		_, _, names := unix.ParseDirent(dents[:n], -1, nil)
		for _, name := range names {
			pid, err := strconv.Atoi(name)
			if err != nil || pid <= 1 {
				continue
			}
			if s, ok := procSession(root+"/"+name+"/stat", stat); ok && s == sid {
				pids = append(pids, pid)
			}
		}
	}
}

// procSession reads the session of a live process from its stat file
// ("pid (comm) state ppid pgrp session ...", comm may hold ") ").
func procSession(path string, buf []byte) (int, bool) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, false
	}
	n, err := unix.Read(fd, buf)
	unix.Close(fd)
	if err != nil || n <= 0 {
		return 0, false
	}
	b := buf[:n]
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 4 || f[0] == "Z" || f[0] == "X" {
		return 0, false
	}
	s, err := strconv.Atoi(f[3])
	return s, err == nil
}

// killExec ends an exec's processes: its group, and on a PTY its session.
// Only a PTY exec pays for the look at every process: a shell without a
// terminal runs jobs in its own group unless told otherwise.
func killExec(leader int, session bool) {
	if session {
		killSession(leader)
		return
	}
	killGroup(leader)
}
