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
// are removed from the workload's environment. The nonce is not among
// them: see ReadNonceFile.
const (
	EnvUID = "CTL_AGENT_UID"
	EnvGID = "CTL_AGENT_GID"
	// EnvNonce is refused: a process's initial environment stays readable
	// in /proc/<pid>/environ for as long as it runs, and gVisor serves that
	// file to every guest user (seen in the VM: uid 1000 read root's
	// /proc/1/environ, dumpable or not).
	EnvNonce = "CTL_AGENT_NONCE"
	// envPrefix starts every agent setting: none reaches the workload.
	envPrefix = "CTL_AGENT_"
)

// Config is what the agent reads from its environment.
type Config struct {
	Nonce string
	User  wire.User
	// Env is the environment left for the workload.
	Env []string
}

// ConfigFromEnv takes the agent's settings out of env. A nonce in env is
// refused (it would be readable by every guest user for the agent's life).
func ConfigFromEnv(env []string) (Config, error) {
	var c Config
	for _, e := range env {
		k, v, _ := strings.Cut(e, "=")
		switch k {
		case EnvNonce:
			return c, fmt.Errorf("%s in the environment: the nonce comes in a file (--nonce-file), never env", EnvNonce)
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
			if !strings.HasPrefix(k, envPrefix) {
				c.Env = append(c.Env, e)
			}
		}
	}
	return c, nil
}

// MaxNonce bounds the nonce file.
const MaxNonce = 4096

// ReadNonceFile reads the generation's nonce from path and removes the
// file, before the agent starts anything. ctld writes it (mode 0400, root)
// into the agent's socket directory, which the guest sees at /.ctl (0700,
// root): no other guest user can reach it, and from here on it is only in
// the agent's memory. It is never in argv or the environment, which any
// guest user can read in /proc. (Before, the nonce came in env and the
// agent re-executed itself to drop it: a second Go start, ~1 s under
// emulation, on every claim's readiness path.) A file that cannot be
// removed is an error: the nonce would stay readable to guest root.
func ReadNonceFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("read nonce: %w", err)
	}
	b := make([]byte, MaxNonce+1)
	n, err := io.ReadFull(f, b)
	f.Close()
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("read nonce %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil {
		return "", fmt.Errorf("remove nonce file: %w", err)
	}
	if n == 0 || n > MaxNonce {
		return "", fmt.Errorf("nonce file %s: %d bytes, want 1 to %d", path, n, MaxNonce)
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
// group, the agent's working directory: the spec's cwd). Wait forwards
// the termination signals the agent gets to it.
func StartWorkload(r *Reaper, args, env []string, u wire.User) (*Workload, error) {
	return StartWorkloadIn(r, args, env, "", u)
}

// StartWorkloadIn is StartWorkload in working directory dir ("": the
// agent's): a warm agent's workload gets its claim's cwd this way.
func StartWorkloadIn(r *Reaper, args, env []string, dir string, u wire.User) (*Workload, error) {
	argv0, err := lookPath(args[0], env)
	if err != nil {
		return nil, err
	}
	w := &Workload{sigs: make(chan os.Signal, 8)}
	w.pid, w.done, err = r.Start(argv0, args, &syscall.ProcAttr{
		Env: env, Dir: dir, Files: []uintptr{0, 1, 2},
		Sys: &syscall.SysProcAttr{Credential: credential(u), Setpgid: true},
	})
	if err != nil {
		return nil, fmt.Errorf("start workload %s: %w", args[0], err)
	}
	return w, nil
}

// Wait forwards the termination signals the agent gets to the workload
// and returns its exit code once it ends (128+n when killed by signal n);
// when ctx ends first it kills the workload's group. The forwarding
// starts here, after the start was decided, so that its signal setup (see
// Reaper.Run) is off the readiness path; one of these signals that comes
// before ends the agent, and with it the guest.
func (w *Workload) Wait(ctx context.Context) (int, error) {
	signal.Notify(w.sigs, forwarded...)
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

// forwarded are the signals the agent passes on to its workload.
var forwarded = []os.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

// forwardFrom makes sigs, on which the warm agent caught the forwarded
// signals since its boot, the workload's: a signal queued there (one that
// came with the claim) goes to the workload when Wait starts.
func (w *Workload) forwardFrom(sigs chan os.Signal) { w.sigs = sigs }

// RunWorkload is StartWorkload then Wait.
func RunWorkload(ctx context.Context, r *Reaper, args, env []string, u wire.User) (int, error) {
	w, err := StartWorkload(r, args, env, u)
	if err != nil {
		return 127, err
	}
	return w.Wait(ctx)
}
