package agent

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/agent/wire"
)

// A warm agent forks its workload's process at boot: a copy of itself
// (ExecHelperArg) that waits for the claim on a pipe. At the claim it
// takes on the claim's identity (credentials, working directory, no
// CAP_SYS_ADMIN in its bounding set), checks that the command resolves
// to a file it may execute, says so, and execs it. The claim's answer
// waits for that check, not for the exec: under gVisor a process start
// (a new address space: a new host stub process) is most of a warm
// claim's cost, and it now overlaps the answer's way back to the host.
// An exec that fails after the check (a binary the kernel refuses) ends
// the workload with 127 and its reason on the guest's output, as a
// workload that fails at once does.

// ExecHelperArg is the agent's first argument that makes it a warm
// agent's pre-forked workload process; dropSysAdminArg may follow (the
// agent holds CAP_SYS_ADMIN for the claim's hostname).
const (
	ExecHelperArg   = "--exec-helper"
	dropSysAdminArg = "--drop-sys-admin"
)

// Descriptors of the pre-forked process: the claim comes in on one, the
// check's result goes out on the other.
const (
	helperSpecFD   = 3
	helperStatusFD = 4
)

// maxHelperSpec bounds the claim the pre-forked process reads (args and
// env are bounded by the agent's frame already).
const maxHelperSpec = 8 << 20

// helperCheckTimeout bounds how long a claim waits for the pre-forked
// process's check (a few syscalls); helperBootTimeout how long a booting
// member waits for the process to come up (a Go runtime's start-up).
const (
	helperCheckTimeout = 30 * time.Second
	helperBootTimeout  = 2 * time.Minute
)

// helperSpec is what the agent sends its pre-forked process.
type helperSpec struct {
	Args []string  `json:"args"`
	Env  []string  `json:"env"`
	Cwd  string    `json:"cwd"`
	User wire.User `json:"user"`
	// dropSysAdmin: the process's own flag, not the agent's to send.
	dropSysAdmin bool
}

// execHelper is the agent's side of its pre-forked workload process.
type execHelper struct {
	pid    int
	done   <-chan syscall.WaitStatus
	spec   *os.File // the claim goes out here, once
	status *os.File // "waiting", then "ok" or the reason it cannot run
	lines  *bufio.Reader
}

// startExecHelper forks the pre-forked workload process: the agent's own
// binary with no environment, in a process group of its own (the
// workload's), reaped through r. dropSysAdmin: the agent holds
// CAP_SYS_ADMIN (--hostname-cap), which the workload must not.
func startExecHelper(r *Reaper, dropSysAdmin bool) (*execHelper, error) {
	specR, specW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("pre-fork the workload: %w", err)
	}
	statusR, statusW, err := os.Pipe()
	if err != nil {
		specR.Close()
		specW.Close()
		return nil, fmt.Errorf("pre-fork the workload: %w", err)
	}
	argv := []string{"ctl-agent", ExecHelperArg}
	if dropSysAdmin {
		argv = append(argv, dropSysAdminArg)
	}
	pid, done, err := r.Start("/proc/self/exe", argv, &syscall.ProcAttr{
		Env:   []string{},
		Files: []uintptr{0, 1, 2, specR.Fd(), statusW.Fd()},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	})
	specR.Close()
	statusW.Close()
	if err != nil {
		specW.Close()
		statusR.Close()
		return nil, fmt.Errorf("pre-fork the workload: %w", err)
	}
	h := &execHelper{pid: pid, done: done, spec: specW, status: statusR, lines: bufio.NewReader(io.LimitReader(statusR, 4096))}
	// Its runtime's start-up is the member's boot, not the claim's: the
	// member is ready once its pre-forked process waits for the claim.
	_ = statusR.SetReadDeadline(time.Now().Add(helperBootTimeout))
	if line, err := h.lines.ReadString('\n'); err != nil || line != "waiting\n" {
		unix.Kill(pid, unix.SIGKILL)
		specW.Close()
		statusR.Close()
		return nil, fmt.Errorf("pre-fork the workload: it did not come up (%q, %v)", line, err)
	}
	return h, nil
}

// start hands c to the pre-forked process and returns it as the workload
// once it checked that it can exec c's command (its exec then runs on).
func (h *execHelper) start(c Claim) (*Workload, error) {
	defer h.spec.Close()
	defer h.status.Close()
	b, err := json.Marshal(helperSpec{Args: c.Args, Env: c.Env, Cwd: c.Cwd, User: c.User})
	if err != nil {
		return nil, fmt.Errorf("start workload: %w", err)
	}
	// Bounded both ways: a pre-forked process that hangs costs the claim
	// helperCheckTimeout, never the agent.
	_ = h.spec.SetWriteDeadline(time.Now().Add(helperCheckTimeout))
	if _, err := h.spec.Write(b); err != nil {
		unix.Kill(h.pid, unix.SIGKILL)
		return nil, fmt.Errorf("start workload %s: the pre-forked process is gone: %w", c.Args[0], err)
	}
	h.spec.Close()
	_ = h.status.SetReadDeadline(time.Now().Add(helperCheckTimeout))
	line, err := h.lines.ReadString('\n')
	if err != nil {
		unix.Kill(h.pid, unix.SIGKILL)
		return nil, fmt.Errorf("start workload %s: the pre-forked process did not answer: %w", c.Args[0], err)
	}
	if line = strings.TrimSuffix(line, "\n"); line != "ok" {
		return nil, fmt.Errorf("start workload %s: %s", c.Args[0], line)
	}
	return &Workload{pid: h.pid, done: h.done, sigs: make(chan os.Signal, 8)}, nil
}

// RunExecHelper is the pre-forked workload process (ctl-agent
// --exec-helper [--drop-sys-admin]; args after the first): it waits for
// the claim, becomes its workload and execs it; it returns only when it
// cannot (the agent went away: 0; the claim cannot run: 127).
func RunExecHelper(args []string, stderr io.Writer) int {
	if len(args) > 1 || len(args) == 1 && args[0] != dropSysAdminArg {
		fmt.Fprintf(stderr, "ctl-agent: %s takes only %s\n", ExecHelperArg, dropSysAdminArg)
		return 2
	}
	// The identity switch is made on this thread alone, the one that
	// execs: the exec ends every other thread, so what they hold never
	// reaches the workload (and each all-threads syscall of the Go
	// runtime is a stop of every thread, costly under gVisor).
	runtime.LockOSThread()
	unix.CloseOnExec(helperSpecFD)
	unix.CloseOnExec(helperStatusFD)
	in := os.NewFile(helperSpecFD, "claim")
	status := os.NewFile(helperStatusFD, "status")
	if _, err := status.WriteString("waiting\n"); err != nil {
		return 0 // the agent gave up on us
	}
	s := helperSpec{dropSysAdmin: len(args) == 1}
	if err := json.NewDecoder(io.LimitReader(in, maxHelperSpec)).Decode(&s); err != nil {
		if !errors.Is(err, io.EOF) {
			fmt.Fprintln(stderr, "ctl-agent: pre-forked workload: bad claim:", err)
		}
		return 0
	}
	in.Close()
	argv0, err := s.become()
	if err != nil {
		fmt.Fprintf(status, "%s\n", strings.ReplaceAll(err.Error(), "\n", " "))
		return 127
	}
	if _, err := status.WriteString("ok\n"); err != nil {
		return 127 // the agent gave up on the claim
	}
	err = syscall.Exec(argv0, s.Args, s.Env)
	fmt.Fprintf(stderr, "ctl-agent: exec %s: %v\n", s.Args[0], err)
	return 127
}

// become makes this process s's workload but for the exec: no
// CAP_SYS_ADMIN in the bounding set when the agent held it for the
// hostname (checked after the drop), s's credentials and working directory; it returns the
// command's path once that is a file this user may execute in a format
// the kernel runs (ELF or #!).
func (s helperSpec) become() (string, error) {
	if len(s.Args) == 0 {
		return "", errors.New("no command")
	}
	// Raw syscalls of this (locked) thread only; see RunExecHelper.
	if s.dropSysAdmin {
		if _, _, e := unix.RawSyscall(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, unix.CAP_SYS_ADMIN, 0); e != 0 {
			return "", fmt.Errorf("drop CAP_SYS_ADMIN from the bounding set: %w", e)
		}
		if in, _, _ := unix.RawSyscall(unix.SYS_PRCTL, unix.PR_CAPBSET_READ, unix.CAP_SYS_ADMIN, 0); in != 0 {
			return "", errors.New("CAP_SYS_ADMIN still in the bounding set after the drop")
		}
	}
	if os.Getuid() == 0 {
		if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); e != 0 {
			return "", fmt.Errorf("set groups: %w", e)
		}
	}
	// As the agent's ForkExec did for a workload: gid first, while root.
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(s.User.GID), uintptr(s.User.GID), uintptr(s.User.GID)); e != 0 {
		return "", fmt.Errorf("set gid %d: %w", s.User.GID, e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(s.User.UID), uintptr(s.User.UID), uintptr(s.User.UID)); e != 0 {
		return "", fmt.Errorf("set uid %d: %w", s.User.UID, e)
	}
	cwd := s.Cwd
	if cwd == "" {
		cwd = "/"
	}
	if err := syscall.Chdir(cwd); err != nil {
		return "", fmt.Errorf("chdir %s: %w", cwd, err)
	}
	argv0, err := lookPath(s.Args[0], s.Env)
	if err != nil {
		return "", err
	}
	if err := unix.Access(argv0, unix.X_OK); err != nil {
		return "", fmt.Errorf("%s: %w", argv0, err)
	}
	f, err := os.Open(argv0)
	if err != nil {
		return "", err
	}
	var magic [4]byte
	n, _ := io.ReadFull(f, magic[:])
	f.Close()
	if m := string(magic[:n]); m != "\x7fELF" && !strings.HasPrefix(m, "#!") {
		return "", fmt.Errorf("%s: %w", argv0, syscall.ENOEXEC)
	}
	return argv0, nil
}
