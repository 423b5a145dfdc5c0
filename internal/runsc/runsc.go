package runsc

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/ctld/ctld/internal/guestlog"
	"github.com/ctld/ctld/internal/logging"
)

// ErrNotExist is returned (wrapped) when runsc has no container of that id.
var ErrNotExist = errors.New("container does not exist")

// State is the part of `runsc state` ctld uses.
type State struct {
	ID     string `json:"id"`
	Status string `json:"status"` // creating, created, running, paused, stopped
	Pid    int    `json:"pid"`    // the sandbox process on the host; -1 once stopped
	Bundle string `json:"bundle"`
}

// ExecProcess is a process to run in an existing container.
type ExecProcess struct {
	Args, Env []string
	Cwd       string // default "/"
	UID, GID  uint32
	// CgroupDir, when set, is the cgroup v2 directory the host-side
	// `runsc exec` process starts in (clone3 CLONE_INTO_CGROUP), so its
	// CPU, memory and PIDs are charged to the sandbox's lease, never to
	// ctld's cgroup, not even for the moment between fork and a move.
	CgroupDir string
}

// Runtime drives the runsc binary. Every container of one Runtime lives under
// Root; the zero values of the other fields are usable defaults.
//
// Logs: each container has a directory LogDir/<id>/ (see guestlog):
// runsc's own log is runsc.log there (the sandbox and gofer keep writing to
// it), the init process's stdout/stderr go where InitOutput says (default
// the file init.log there), and commands not about one container log to
// LogDir/runsc.log. LogDir defaults to Root+".logs".
type Runtime struct {
	Binary string // default "runsc"
	Root   string // runsc state root, e.g. /run/ctld/runsc
	// Platform is runsc's --platform; "" passes none: the binary's own
	// default (ptrace on Debian's 20221219, systrap on a current build).
	Platform string
	// Version is `runsc --version` of Binary, when known: Create records
	// it per container, and Delete reads runsc's state files itself only
	// for a build listed in StateFormats.
	Version string
	// Network is runsc's --network: "sandbox" (default) runs gVisor's
	// netstack in the spec's netns; "none" is for hosts that cannot give a
	// netns (it ignores the spec's netns).
	Network string
	LogDir  string
	// ExecOOMScoreAdj, when set, is the oom_score_adj of each `runsc exec`
	// process, which lives as long as the guest command: the guest's own,
	// not ctld's protective one it would inherit. (The sandbox and gofer
	// take theirs from the spec's process.oomScoreAdj.)
	ExecOOMScoreAdj *int
	// IgnoreCgroups passes --ignore-cgroups, for hosts without a usable
	// cgroup v2 only. ctld leaves it false: the sandbox joins the lease.
	IgnoreCgroups bool
	// HostUDS, when set, is runsc's --host-uds (none, open, create, all):
	// "create" lets a guest listen on a Unix socket in a bind-mounted host
	// directory that a host process can connect to (the guest agent's
	// socket). It counts per container, at `runsc start`.
	HostUDS string
	// Env is every runsc command's whole environment; nil: MinimalEnv.
	Env []string
	// Debug adds runsc debug logs under LogDir/<id>.debug/.
	Debug bool
	// SharedRoot passes --file-access=shared: the sentry revalidates the
	// root filesystem, so files ctld writes into the root from the host
	// (the files API) are seen by the guest. Costs some guest FS speed.
	SharedRoot bool
	// LogMaxBytes, when > 0, caps each runsc log file: before every runsc
	// command a log past the cap keeps its latest half (guestlog.Cap).
	LogMaxBytes int64
	// InitOutput, when set, gives the file that becomes container id's
	// init stdout and stderr (e.g. the write end of a pipe to a bounded
	// log writer), and a wait that returns once what was written to it is
	// readable in the log; Create closes its copy of the file after runsc
	// create returned. nil: append to the file InitLogFile(id), unbounded
	// (for tools and tests).
	InitOutput func(id string) (out *os.File, wait func(context.Context) error, err error)
	Logger     *slog.Logger
}

func (r *Runtime) binary() string {
	if r.Binary == "" {
		return "runsc"
	}
	return r.Binary
}

func (r *Runtime) logDir() string {
	if r.LogDir == "" {
		return r.Root + ".logs"
	}
	return r.LogDir
}

func (r *Runtime) logger() *slog.Logger {
	return logging.OrDiscard(r.Logger)
}

// logFile is runsc's --log for container id ("" = not about one container).
// The sandbox and gofer inherit it on their command lines, which is how
// CheckGone recognises a gofer (its command line has no container id).
func (r *Runtime) logFile(id string) string {
	if id == "" {
		return filepath.Join(r.logDir(), guestlog.RunscName)
	}
	return filepath.Join(r.ContainerLogDir(id), guestlog.RunscName)
}

// legacyLogFile is the --log of containers created by ctld before
// per-container log directories; their gofers still carry it.
func (r *Runtime) legacyLogFile(id string) string {
	return filepath.Join(r.logDir(), id+".log")
}

// LogRoot is the directory of the per-container log directories.
func (r *Runtime) LogRoot() string { return r.logDir() }

// ContainerLogDir is the log directory of container id.
func (r *Runtime) ContainerLogDir(id string) string {
	return filepath.Join(r.logDir(), id)
}

// PanicLogFile is where container id's sandbox and gofer write a Go
// panic or fatal error (runsc --panic-log).
func (r *Runtime) PanicLogFile(id string) string {
	return filepath.Join(r.ContainerLogDir(id), guestlog.PanicName)
}

// InitLogFile is where the init process of container id writes its output
// (the current half, when InitOutput is a guestlog writer).
func (r *Runtime) InitLogFile(id string) string {
	return filepath.Join(r.ContainerLogDir(id), guestlog.InitName)
}

// prepareLog makes the log directory a command about id writes to and caps
// its log. A command may run after the generation's logs were removed (a
// repeated teardown): the directory is made again and removed again by the
// teardown's later log step.
func (r *Runtime) prepareLog(id string) error {
	dir := r.logDir()
	if id != "" {
		dir = r.ContainerLogDir(id)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create runsc log dir: %w", err)
	}
	if r.LogMaxBytes > 0 {
		if err := guestlog.Cap(r.logFile(id), r.LogMaxBytes); err != nil {
			r.logger().Warn("cap runsc log", "container", id, "err", err)
		}
	}
	return nil
}

// GlobalArgs are the flags before the subcommand for a command about
// container id ("" for none).
func (r *Runtime) GlobalArgs(id string) []string {
	network := r.Network
	if network == "" {
		network = "sandbox"
	}
	args := []string{"--root=" + r.Root}
	if r.Platform != "" {
		args = append(args, "--platform="+r.Platform)
	}
	// --overlay2=none: the guest writes into the root ctld made (overlay
	// upper or block device), never into a sentry overlay; a current
	// build's default (root:self) would also refuse --file-access=shared.
	// 20221219's default is none already.
	args = append(args, "--network="+network, "--overlay2=none", "--log="+r.logFile(id))
	args = append(args, BuildFlags(r.Version)...)
	if id != "" {
		// runsc 20221219 expands no %ID% in it: the path names the
		// container. Only the commands that start a sandbox or gofer
		// (create) open it; they append.
		args = append(args, "--panic-log="+r.PanicLogFile(id))
	}
	if r.IgnoreCgroups {
		args = append(args, "--ignore-cgroups")
	}
	if r.SharedRoot {
		args = append(args, "--file-access=shared")
	}
	if r.HostUDS != "" {
		args = append(args, "--host-uds="+r.HostUDS)
	}
	if r.Debug && id != "" {
		args = append(args, "--debug", "--debug-log="+filepath.Join(r.ContainerLogDir(id), "debug")+"/")
	}
	return args
}

// BuildFlags are the global flags a runsc build needs beside the ones
// every build takes (version as Version reports it; "" for unknown).
func BuildFlags(version string) []string {
	if version == "" || version == DebianVersion {
		return nil
	}
	// Builds after 20221219 give their gofers one shared empty netns,
	// bind-mounted at <root>/null-netns and never unmounted; "new" gives
	// each gofer its own, gone with it. 20221219 has no such flag.
	return []string{"--gofer-network-namespace=new"}
}

// MinimalEnv is runsc's environment unless Runtime.Env says otherwise:
// a PATH and nothing of ctld's own (its AWS_* credentials for the block
// store, its test hooks), which runsc would pass on to the sandbox and
// gofer processes it starts.
var MinimalEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C"}

func (r *Runtime) command(ctx context.Context, id string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, r.binary(), append(r.GlobalArgs(id), args...)...)
	// Set explicitly: a nil Env would inherit ctld's whole environment.
	cmd.Env = MinimalEnv
	if r.Env != nil {
		cmd.Env = r.Env
	}
	return cmd
}

// run runs a runsc command that prints a result (or nothing) and exits.
// id is the container it is about ("" for none): the callers pass ids
// that checkID passed.
func (r *Runtime) run(ctx context.Context, id string, args ...string) ([]byte, error) {
	if err := r.prepareLog(id); err != nil {
		return nil, err
	}
	cmd := r.command(ctx, id, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	r.logger().Debug("runsc", "args", args, "container", id, "took", time.Since(start), "err", err)
	if err != nil {
		return stdout.Bytes(), cmdError(args[0], id, err, stderr.String())
	}
	return stdout.Bytes(), nil
}

// cmdError turns a failed runsc run into "runsc <verb> <id>: <stderr>: err",
// wrapping ErrNotExist when runsc says the container is not there.
func cmdError(verb, id string, err error, stderr string) error {
	msg := strings.TrimSpace(stderr)
	if len(msg) > 2048 {
		msg = "..." + msg[len(msg)-2048:]
	}
	if notExist(msg) {
		return fmt.Errorf("runsc %s %s: %s: %w", verb, id, msg, ErrNotExist)
	}
	if msg != "" {
		return fmt.Errorf("runsc %s %s: %s: %w", verb, id, msg, err)
	}
	return fmt.Errorf("runsc %s %s: %w", verb, id, err)
}

// notExist recognises runsc 20221219's "loading container: file does not
// exist" and "loading sandbox: ..." (it has no distinct exit code).
func notExist(msg string) bool {
	return strings.Contains(msg, "does not exist") && strings.Contains(msg, "loading ")
}

// Create creates container id from the bundle in bundleDir: runsc starts
// the sandbox and gofer, which outlive this process. Their stdio is
// /dev/null and InitOutput (a log file, or a pipe to a log writer that
// outlives us too), never a pipe of ours, and they run in their own
// session, so our exit or our process group's signals do not reach them.
func (r *Runtime) Create(ctx context.Context, id, bundleDir string) error {
	if err := ValidID(id); err != nil {
		return fmt.Errorf("runsc create: %w", err)
	}
	if err := r.prepareLog(id); err != nil {
		return err
	}
	if err := os.MkdirAll(r.Root, 0o700); err != nil {
		return fmt.Errorf("create runsc root: %w", err)
	}
	// A container of this id exists (runsc lists it by its state file):
	// refused before runsc, whose failed create deletes the existing
	// container's state and so orphans its sandbox and gofer (seen in the
	// VM: node/guest/runtimetest's create-twice case).
	if _, err := os.Lstat(filepath.Join(r.Root, stateName(id, "state"))); err == nil {
		return fmt.Errorf("runsc create %s: container with id %s already exists: %w", id, id, fs.ErrExist)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("runsc create %s: %w", id, err)
	}
	if err := r.recordVersion(id); err != nil {
		return err
	}
	out, wait, err := r.initOutput(id)
	if err != nil {
		return fmt.Errorf("open init output: %w", err)
	}
	defer out.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		return fmt.Errorf("open %s: %w", os.DevNull, err)
	}
	defer null.Close()
	// stdout and stderr must be two open file descriptions of the same
	// file: the sentry makes each imported host fd non-blocking, and with
	// one shared description the second one it imports looks non-blocking
	// to the guest, whose writes then fail with EAGAIN whenever the pipe to
	// the log writer is full.
	errOut, err := reopen(out)
	if err != nil {
		return fmt.Errorf("open init output: %w", err)
	}
	defer errOut.Close()

	cmd := r.command(ctx, id, "create", "--bundle", bundleDir, id)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = null, out, errOut
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	t0 := time.Now()
	err = cmd.Run()
	r.logger().Debug("runsc", "args", []string{"create"}, "container", id, "took", time.Since(t0), "err", err)
	out.Close() // the sandbox holds its own copies
	errOut.Close()
	if err != nil {
		// runsc's own error went to the init output (its stderr): quote
		// it once the writer has it in the log.
		if wait != nil {
			wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			_ = wait(wctx)
			cancel()
		}
		tail, _ := guestlog.Tail(r.ContainerLogDir(id), guestlog.InitName, 4096)
		return cmdError("create", id, err, string(tail))
	}
	return nil
}

// reopen opens f again as a new open file description, for writing (and
// appending, for a regular file): a pipe reopened through /proc is the same
// pipe.
func reopen(f *os.File) (*os.File, error) {
	return os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", f.Fd()), os.O_WRONLY|os.O_APPEND, 0)
}

// initOutput opens the init's stdout/stderr for container id.
func (r *Runtime) initOutput(id string) (*os.File, func(context.Context) error, error) {
	if r.InitOutput != nil {
		return r.InitOutput(id)
	}
	f, err := os.OpenFile(r.InitLogFile(id), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	return f, nil, err
}

// checkID refuses a bad container id before it becomes a log dir path
// (prepareLog) or a runsc argument ("-x" would be a flag).
func checkID(verb, id string) error {
	if err := ValidID(id); err != nil {
		return fmt.Errorf("runsc %s: %w", verb, err)
	}
	return nil
}

// Start starts the init process of a created container.
func (r *Runtime) Start(ctx context.Context, id string) error {
	if err := checkID("start", id); err != nil {
		return err
	}
	_, err := r.run(ctx, id, "start", id)
	return err
}

// State returns runsc's view of container id, or an error wrapping
// ErrNotExist.
func (r *Runtime) State(ctx context.Context, id string) (State, error) {
	if err := checkID("state", id); err != nil {
		return State{}, err
	}
	out, err := r.run(ctx, id, "state", id)
	if err != nil {
		return State{}, err
	}
	return ParseState(out)
}

// ParseState decodes `runsc state` output.
func ParseState(b []byte) (State, error) {
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return State{}, fmt.Errorf("decode runsc state %q: %w", truncate(b, 256), err)
	}
	if s.ID == "" || s.Status == "" {
		return State{}, fmt.Errorf("decode runsc state %q: no id or status", truncate(b, 256))
	}
	return s, nil
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}

// ExecSpec describes p as the OCI process runsc exec runs: the same
// privileges as a container's init (no new privileges, minimal
// capabilities).
func ExecSpec(p ExecProcess) (*specs.Process, error) {
	if len(p.Args) == 0 || p.Args[0] == "" {
		return nil, errors.New("exec spec: empty command")
	}
	if p.Cwd != "" && !filepath.IsAbs(p.Cwd) {
		return nil, fmt.Errorf("exec spec: cwd %q: must be absolute", p.Cwd)
	}
	for _, e := range p.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return nil, fmt.Errorf("exec spec: env %q: must be KEY=VALUE", e)
		}
	}
	cwd := p.Cwd
	if cwd == "" {
		cwd = "/"
	}
	env := append([]string(nil), p.Env...)
	if !hasEnv(env, "PATH") {
		env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, env...)
	}
	return &specs.Process{
		User:            specs.User{UID: p.UID, GID: p.GID},
		Args:            append([]string(nil), p.Args...),
		Env:             env,
		Cwd:             cwd,
		NoNewPrivileges: true,
		Capabilities:    capabilities(p.UID, false),
	}, nil
}

// execWaitDelay bounds how long Exec waits for output after runsc exec
// ended (or after a cancel), should anything else still hold the pipes.
const execWaitDelay = 2 * time.Second

// Exec runs p in container id, streaming its output, and returns its exit
// code. Cancelling ctx kills the guest process (not only runsc exec).
//
// runsc exits 128 on its own failures too; Exec tells those apart by
// checking that the container still exists.
func (r *Runtime) Exec(ctx context.Context, id string, p ExecProcess, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	if err := checkID("exec", id); err != nil {
		return -1, err
	}
	ps, err := ExecSpec(p)
	if err != nil {
		return -1, err
	}
	if err := r.prepareLog(id); err != nil {
		return -1, err
	}
	tmp, err := os.MkdirTemp("", "ctld-exec-")
	if err != nil {
		return -1, fmt.Errorf("create exec temp dir: %w", err)
	}
	defer os.RemoveAll(tmp)
	b, err := json.Marshal(ps)
	if err != nil {
		return -1, fmt.Errorf("encode exec process: %w", err)
	}
	procFile, pidFile := filepath.Join(tmp, "process.json"), filepath.Join(tmp, "pid")
	if err := os.WriteFile(procFile, b, 0o600); err != nil {
		return -1, fmt.Errorf("write exec process: %w", err)
	}

	cmd := r.command(ctx, id, "exec", "--process", procFile, "--internal-pid-file", pidFile, id)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	if p.CgroupDir != "" {
		cg, err := os.OpenFile(p.CgroupDir, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
		if err != nil {
			return -1, fmt.Errorf("open cgroup of exec in %s: %w", id, err)
		}
		defer cg.Close()
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	}
	cmd.WaitDelay = execWaitDelay
	killed := false
	killGuest := func() {
		// Killing runsc exec alone would leave the guest process running.
		pid, err := readPid(pidFile)
		if err != nil || killed {
			return
		}
		killed = true
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if _, err := r.run(kctx, id, "kill", "--pid", strconv.Itoa(pid), id, "KILL"); err != nil {
			r.logger().Warn("kill exec process", "container", id, "pid", pid, "err", err)
		}
	}
	cmd.Cancel = func() error {
		killGuest()
		return cmd.Process.Kill()
	}
	t0 := time.Now()
	if err = cmd.Start(); err == nil {
		r.setOOMScoreAdj(id, cmd.Process.Pid)
		err = cmd.Wait()
	}
	r.logger().Debug("runsc", "args", []string{"exec"}, "container", id, "took", time.Since(t0), "err", err)
	if ctx.Err() != nil {
		// runsc may have written the pid only after Cancel looked for it.
		killGuest()
		return -1, fmt.Errorf("runsc exec %s: %w", id, ctx.Err())
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &ee) && ee.Exited():
		code := ee.ExitCode()
		if code == 128 {
			if _, serr := r.State(context.WithoutCancel(ctx), id); serr != nil {
				return -1, fmt.Errorf("runsc exec %s: %w", id, serr)
			}
		}
		return code, nil
	default:
		return -1, fmt.Errorf("runsc exec %s: %w", id, err)
	}
}

// setOOMScoreAdj gives a runsc process the guest's oom_score_adj. It runs
// right after the fork; until then the process has ctld's. A failure is
// logged, not fatal: the command still runs, only more protected.
func (r *Runtime) setOOMScoreAdj(id string, pid int) {
	if r.ExecOOMScoreAdj == nil {
		return
	}
	p := fmt.Sprintf("/proc/%d/oom_score_adj", pid)
	if err := os.WriteFile(p, []byte(strconv.Itoa(*r.ExecOOMScoreAdj)), 0); err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ESRCH) {
		r.logger().Warn("set oom_score_adj of runsc exec", "container", id, "pid", pid, "err", err)
	}
}

func readPid(p string) (int, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// Kill sends sig to the init process of container id, or to all its
// processes.
func (r *Runtime) Kill(ctx context.Context, id string, sig syscall.Signal, all bool) error {
	if err := checkID("kill", id); err != nil {
		return err
	}
	args := []string{"kill"}
	if all {
		args = append(args, "--all")
	}
	_, err := r.run(ctx, id, append(args, id, strconv.Itoa(int(sig)))...)
	return err
}

// deleteAttempts bounds retries of a failing delete (e.g. a cgroup still
// busy right after the sandbox died).
const deleteAttempts = 5

// Delete destroys container id, killing it if it runs. A container that
// does not exist is already deleted. A root container whose processes are
// all dead (e.g. after its lease's cgroup.kill) is deleted by removing
// runsc's state files, without starting runsc and waiting out its polls
// (see dead.go); anything else by `runsc delete --force`.
func (r *Runtime) Delete(ctx context.Context, id string) error {
	if err := checkID("delete", id); err != nil {
		return err
	}
	t0 := time.Now()
	removed, why, err := r.removeDead(id)
	if err != nil {
		return err
	}
	if removed {
		r.logger().Debug("runsc state of a dead container removed", "container", id, "took", time.Since(t0))
		return nil
	}
	r.logger().Debug("runsc delete needed", "container", id, "why", why)
	return r.runscDelete(ctx, id)
}

// runscDelete runs `runsc delete --force`, retried a few times.
func (r *Runtime) runscDelete(ctx context.Context, id string) error {
	var err error
	for i := range deleteAttempts {
		if i > 0 {
			select {
			case <-ctx.Done():
				return errors.Join(err, ctx.Err())
			case <-time.After(time.Duration(i) * 200 * time.Millisecond):
			}
		}
		_, err = r.run(ctx, id, "delete", "--force", id)
		if err == nil || errors.Is(err, ErrNotExist) {
			return nil
		}
	}
	return err
}

// List returns the ids of the containers under Root, sorted.
func (r *Runtime) List(ctx context.Context) ([]string, error) {
	if _, err := os.Stat(r.Root); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	out, err := r.run(ctx, "", "list", "-quiet")
	if err != nil {
		return nil, err
	}
	ids := strings.Fields(string(out))
	slices.Sort(ids)
	return ids, nil
}

// CheckGone proves container id is physically absent: no state or lock
// file of it is left in Root, and no runsc sandbox or gofer process of it
// runs. detail says what is left (or what was checked).
//
// It does not run `runsc list` (a runsc process per proof): runsc lists
// exactly the containers with a "<id>_sandbox:<sandbox>.state" file in
// Root (runsc/container/state_file.go, unchanged from 20221219 to 2026),
// which stateFiles reads itself; TestRunscListIsStateFiles pins that.
func (r *Runtime) CheckGone(ctx context.Context, id string) (ok bool, detail string) {
	var left []string
	files, err := stateFiles(r.Root, id)
	if err != nil {
		left = append(left, err.Error())
	}
	for _, f := range files {
		left = append(left, "state file "+f)
	}
	procs, err := r.processes(id)
	if err != nil {
		left = append(left, err.Error())
	}
	for _, p := range procs {
		left = append(left, "process "+p)
	}
	if len(left) > 0 {
		return false, strings.Join(left, "; ")
	}
	return true, fmt.Sprintf("no state files under %s, no sandbox/gofer processes", r.Root)
}

// Known lists the containers that have runsc state files under Root, by
// reading the directory: no runsc process is started, so a takeover can
// take stock of many guests at once. It says nothing about liveness.
func (r *Runtime) Known() ([]string, error) {
	ents, err := os.ReadDir(r.Root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read runsc root: %w", err)
	}
	seen := map[string]bool{}
	for _, e := range ents {
		if id, _, ok := strings.Cut(e.Name(), "_sandbox:"); ok && ValidID(id) == nil {
			seen[id] = true
		}
	}
	return slices.Sorted(maps.Keys(seen)), nil
}

// stateFiles lists runsc's files for container id in root. runsc 20221219
// names them "<container>_sandbox:<sandbox>.state" (and ".lock"); a
// current build adds the sandbox's control socket runsc-<container>.sock.
func stateFiles(root, id string) ([]string, error) {
	ents, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read runsc root: %w", err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), id+"_sandbox:") || e.Name() == id || e.Name() == controlSocketName(id) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// processes finds runsc processes of container id under this Root by their
// command lines: the sandbox ends with the id, the gofer carries the
// per-container --log this driver gave it.
func (r *Runtime) processes(id string) ([]string, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("read /proc: %w", err)
	}
	var out []string
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue // exited meanwhile, or a kernel thread
		}
		argv := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if r.ownsCmdline(argv, id) {
			out = append(out, e.Name()+":"+argv[0])
		}
	}
	return out, nil
}

// ownsCmdline reports whether argv is a runsc sandbox or gofer of container
// id under this Root.
func (r *Runtime) ownsCmdline(argv []string, id string) bool {
	if len(argv) == 0 || !strings.HasPrefix(filepath.Base(argv[0]), "runsc") {
		return false
	}
	if !slices.Contains(argv, "--root="+r.Root) {
		return false
	}
	return argv[len(argv)-1] == id || slices.Contains(argv, "--log="+r.logFile(id)) ||
		slices.Contains(argv, "--log="+r.legacyLogFile(id))
}

// Version returns the version runsc reports, e.g. "0.0~20221219.0".
func Version(ctx context.Context, binary string) (string, error) {
	if binary == "" {
		binary = "runsc"
	}
	out, err := exec.CommandContext(ctx, binary, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("run %s --version: %w", binary, err)
	}
	v, err := ParseVersion(string(out))
	if err != nil || v != versionMissing {
		return v, err
	}
	// A build by `go install` (test/vm/setup.sh's current build) has no
	// release version linked in: it is named by its Go module version.
	p, err := exec.LookPath(binary)
	if err != nil {
		return v, nil
	}
	bi, err := buildinfo.ReadFile(p)
	if err != nil {
		return v, nil
	}
	return ModuleVersion(v, bi), nil
}

// versionMissing is what a runsc built without bazel's stamping says.
const versionMissing = "VERSION_MISSING"

// ModuleVersion names a build that reported no version by the module it
// was built from ("gvisor.dev/gvisor@v0.0.0-..."), or returns reported.
func ModuleVersion(reported string, bi *debug.BuildInfo) string {
	if reported != versionMissing || bi == nil || bi.Main.Path == "" || bi.Main.Version == "" || bi.Main.Version == "(devel)" {
		return reported
	}
	return bi.Main.Path + "@" + bi.Main.Version
}

// ParseVersion reads the version from `runsc --version` output.
func ParseVersion(out string) (string, error) {
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "runsc version "); ok && v != "" {
			return v, nil
		}
	}
	return "", fmt.Errorf("parse runsc version from %q", truncate([]byte(out), 256))
}

// Platforms reads which platforms binary offers and which it uses when
// given no --platform, from `runsc flags` (the platform flag's help:
// "specifies which platform to use: ptrace (default), kvm. (default
// \"ptrace\")"). For `ctld doctor`: ctld passes --platform or nothing.
func Platforms(ctx context.Context, binary string) (def string, all []string, err error) {
	if binary == "" {
		binary = "runsc"
	}
	out, err := exec.CommandContext(ctx, binary, "flags").CombinedOutput()
	if err != nil {
		return "", nil, fmt.Errorf("run %s flags: %w", binary, err)
	}
	return ParsePlatforms(string(out))
}

// ParsePlatforms reads the platform flag's help of `runsc flags` output.
func ParsePlatforms(out string) (def string, all []string, err error) {
	for _, line := range strings.Split(out, "\n") {
		_, list, ok := strings.Cut(line, "specifies which platform to use:")
		if !ok {
			continue
		}
		if i := strings.Index(list, `(default "`); i >= 0 {
			def, _, _ = strings.Cut(list[i+len(`(default "`):], `"`)
			list = list[:i]
		}
		for _, p := range strings.Split(list, ",") {
			p = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(p), "."))
			p = strings.TrimSpace(strings.TrimSuffix(p, "(default)"))
			if p != "" {
				all = append(all, p)
			}
		}
		if def == "" || len(all) == 0 {
			break
		}
		return def, all, nil
	}
	return "", nil, fmt.Errorf("parse runsc platforms from %q", truncate([]byte(out), 256))
}
