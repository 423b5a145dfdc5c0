package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/agent/wire"
)

// Environment of the agent, set in the OCI spec's process.env by ctld. They
// are removed from the workload's environment.
const (
	EnvNonce = "CTL_AGENT_NONCE"
	EnvUID   = "CTL_AGENT_UID"
	EnvGID   = "CTL_AGENT_GID"
)

// Config is what the agent reads from its environment.
type Config struct {
	Nonce string
	User  wire.User
	// Env is the environment left for the workload.
	Env []string
}

// ConfigFromEnv takes the agent's settings out of env.
func ConfigFromEnv(env []string) (Config, error) {
	var c Config
	for _, e := range env {
		k, v, _ := strings.Cut(e, "=")
		switch k {
		case EnvNonce:
			c.Nonce = v
		case EnvNonceFD:
			n, err := readNonceFD(v)
			if err != nil {
				return c, err
			}
			c.Nonce = n
		case EnvUID, EnvGID:
			n, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				return c, fmt.Errorf("%s=%q: %w", k, v, err)
			}
			if k == EnvUID {
				c.User.UID = uint32(n)
			} else {
				c.User.GID = uint32(n)
			}
		default:
			c.Env = append(c.Env, e)
		}
	}
	return c, nil
}

// EnvNonceFD names the descriptor the agent passes its nonce on to itself
// (see HideNonce).
const EnvNonceFD = "CTL_AGENT_NONCE_FD"

// HideNonce takes the nonce out of the agent's environment for good. A
// process's initial environment stays readable in /proc/<pid>/environ for
// as long as it runs, and gVisor serves that file to every guest user
// (seen in the VM: uid 1000 read root's /proc/1/environ, dumpable or not).
// So when the nonce is in env, the agent writes it into a pipe and
// re-executes itself (same pid: still the init) with the nonce removed and
// the pipe's read end named by EnvNonceFD; the new image reads it from
// there. It returns only when there was nothing to hide (or on error).
func HideNonce(env []string) error {
	var nonce string
	var rest []string
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, EnvNonce+"="); ok {
			nonce = v
			continue
		}
		if strings.HasPrefix(e, EnvNonceFD+"=") {
			continue
		}
		rest = append(rest, e)
	}
	if nonce == "" {
		return nil
	}
	if len(nonce) > 4096 {
		return fmt.Errorf("%s: %d bytes", EnvNonce, len(nonce))
	}
	var p [2]int
	if err := unix.Pipe2(p[:], 0); err != nil { // no O_CLOEXEC: the new image inherits it
		return fmt.Errorf("nonce pipe: %w", err)
	}
	if _, err := unix.Write(p[1], []byte(nonce)); err != nil {
		return fmt.Errorf("write nonce pipe: %w", err)
	}
	unix.Close(p[1])
	rest = append(rest, fmt.Sprintf("%s=%d", EnvNonceFD, p[0]))
	exe, err := os.Executable()
	if err != nil {
		exe = "/proc/self/exe"
	}
	return fmt.Errorf("re-exec without the nonce: %w", unix.Exec(exe, os.Args, rest))
}

// readNonceFD reads the nonce HideNonce passed on, and closes the pipe.
func readNonceFD(v string) (string, error) {
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return "", fmt.Errorf("%s=%q: not a descriptor", EnvNonceFD, v)
	}
	f := os.NewFile(uintptr(fd), "nonce")
	defer f.Close()
	b := make([]byte, 4097)
	n, err := io.ReadFull(f, b)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("read nonce: %w", err)
	}
	if n == 0 || n > 4096 {
		return "", fmt.Errorf("read nonce: %d bytes", n)
	}
	return string(b[:n]), nil
}

// Hide makes the agent's /proc/<pid> files (environ with the nonce, mem)
// readable by root only, whatever uid the workload and execs run as:
// a non-dumpable process's /proc files belong to root and ptrace access
// needs CAP_SYS_PTRACE.
func Hide() error {
	return unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
}

// Listen makes the agent's socket at path, mode 0600: only root in the
// guest (and the host, through the bind-mounted directory) may call it,
// since a call may name any user. A stale socket file is replaced: the
// directory is the agent's alone.
func Listen(path string) (net.Listener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket: %w", err)
	}
	old := unix.Umask(0o177)
	l, err := net.Listen("unix", path)
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	return l, nil
}

// Workload is the agent's child: the sandbox's main process.
type Workload struct {
	pid  int
	done <-chan syscall.WaitStatus
	sigs chan os.Signal
}

// StartWorkload starts args as the workload (user u, env, its own process
// group, the agent's working directory: the spec's cwd) and forwards the
// termination signals the agent gets to it from now on.
func StartWorkload(r *Reaper, args, env []string, u wire.User) (*Workload, error) {
	argv0, err := lookPath(args[0], env)
	if err != nil {
		return nil, err
	}
	w := &Workload{sigs: make(chan os.Signal, 8)}
	signal.Notify(w.sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
	w.pid, w.done, err = r.Start(argv0, args, &syscall.ProcAttr{
		Env: env, Files: []uintptr{0, 1, 2},
		Sys: &syscall.SysProcAttr{Credential: credential(u), Setpgid: true},
	})
	if err != nil {
		signal.Stop(w.sigs)
		return nil, fmt.Errorf("start workload %s: %w", args[0], err)
	}
	return w, nil
}

// Wait returns the workload's exit code once it ends (128+n when killed
// by signal n); when ctx ends first it kills the workload's group.
func (w *Workload) Wait(ctx context.Context) (int, error) {
	defer signal.Stop(w.sigs)
	for {
		select {
		case ws := <-w.done:
			code, sig := exitOf(ws)
			if sig != 0 {
				code = 128 + sig
			}
			return code, nil
		case s := <-w.sigs:
			unix.Kill(w.pid, s.(syscall.Signal))
		case <-ctx.Done():
			killGroup(w.pid)
			<-w.done
			return 137, ctx.Err()
		}
	}
}

// RunWorkload is StartWorkload then Wait.
func RunWorkload(ctx context.Context, r *Reaper, args, env []string, u wire.User) (int, error) {
	w, err := StartWorkload(r, args, env, u)
	if err != nil {
		return 127, err
	}
	return w.Wait(ctx)
}
