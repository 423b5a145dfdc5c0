package runsc

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Why Delete does not always run `runsc delete --force`: for a root
// container, runsc 20221219 (runsc/container/container.go Destroy) SIGKILLs
// the sandbox, polls kill(pid, 0) every 100 ms until the sandbox is gone -
// a zombie counts as alive, so it waits for whoever reaps it, which is init,
// not runsc - then does the same for the gofer, uninstalls the cgroups it
// created itself, runs poststop hooks, and removes its two files
// <id>_sandbox:<id>.state and .lock under the flock of the .lock file. For a
// container whose processes are all dead, whose cgroup runsc did not create
// (ctld's leases are made before the container) and whose spec has no
// poststop hook, all that is left of that work is removing the two files:
// removeDead does exactly that, without starting runsc (a large Go binary:
// 0.3-1 s to start in the test VM) and without its polls (1.8 s on a build
// machine whose init reaps zombies late). Anything else - a live process,
// a held lock, a state it does not recognise - is left to runsc.
//
// The state files are runsc's private format, so removeDead only reads
// them for a runsc build it was checked against: Create records the build
// (Runtime.Version) beside the container's logs, and a container with no
// record or another build's is left to `runsc delete --force`. The current
// gVisor build (issue 27) destroys the same way, plus: the sandbox's
// control socket is a file <root>/runsc-<id>.sock (20221219 used an
// abstract one), which removeDead removes too; and a self-backed rootfs
// overlay leaves a filestore file in the root, so a state with any gofer
// overlay is left to runsc (ctld runs with --overlay2=none).

// StateFormats are the runsc builds, by their `runsc --version`, whose
// Destroy removeDead was checked against (runsc/container/container.go of
// each): Debian's 20221219 and the pinned current build of
// test/vm/setup.sh. Add a build only after reading its Destroy and running
// internal/runsc's release kernel tests on it.
var StateFormats = []string{DebianVersion, CurrentVersion}

// DebianVersion is Version of Debian 12's runsc (release 20221219).
const DebianVersion = "0.0~20221219.0"

// CurrentVersion is Version of the current gVisor build test/vm/setup.sh
// installs (its `runsc --version` says VERSION_MISSING: go install links no
// release name, so Version names it by its module).
const CurrentVersion = "gvisor.dev/gvisor@v0.0.0-20260905035102-160fafc42237"

// versionFile is the file in a container's log directory that names the
// runsc build that created it (Runtime.Version).
const versionFile = "runsc.version"

// runscState is the part of runsc's state file (the Container struct
// runsc 20221219 saves as JSON) that says whether deleting the container
// needs more than removing its files.
type runscState struct {
	ID       string `json:"id"`
	Status   string `json:"status"`
	GoferPid int    `json:"goferPid"`
	Spec     *struct {
		Hooks *struct {
			Poststop []json.RawMessage `json:"poststop"`
		} `json:"hooks"`
	} `json:"spec"`
	Sandbox *struct {
		ID     string                     `json:"id"`
		Pid    int                        `json:"pid"`
		Cgroup map[string]json.RawMessage `json:"cgroup"`
		// ControlSocketPath (current builds): runsc-<id>.sock in the root.
		ControlSocketPath string `json:"controlSocketPath"`
	} `json:"sandbox"`
	CompatCgroup map[string]json.RawMessage `json:"compatCgroup"`
	// GoferMountConfs (current builds): an entry with an upper layer
	// (upper != 0, NoOverlay) may have a filestore file runsc delete removes.
	GoferMountConfs []struct {
		Upper int `json:"upper"`
	} `json:"goferMountConfs"`
}

// controlSocket is the sandbox's control socket file of a current build
// (sandbox.controlSocketPath), "" when the state names none.
func (s runscState) controlSocket() string {
	if s.Sandbox == nil {
		return ""
	}
	return s.Sandbox.ControlSocketPath
}

// controlSocketName is a current runsc's control socket file in its root.
func controlSocketName(id string) string { return "runsc-" + id + ".sock" }

// stateName is runsc's file name for root container id ("<container>_sandbox:<sandbox>").
func stateName(id, ext string) string { return id + "_sandbox:" + id + "." + ext }

// plainDelete says why deleting container id under root needs runsc (""
// when it does not): anything but a stopped-or-running root container with
// no poststop hook, no gofer overlay, whose cgroups runsc did not create and
// whose control socket, if a file, is the one runsc makes in root.
func (s runscState) plainDelete(root, id string) string {
	switch {
	case s.ID != id:
		return fmt.Sprintf("state names container %q", s.ID)
	case s.Sandbox == nil || s.Sandbox.ID != id:
		return "not the root container of its sandbox"
	case s.Status == "creating" || s.Status == "":
		return fmt.Sprintf("status %q", s.Status)
	case s.Spec != nil && s.Spec.Hooks != nil && len(s.Spec.Hooks.Poststop) > 0:
		return "poststop hooks"
	case s.controlSocket() != "" && s.controlSocket() != filepath.Join(root, controlSocketName(id)):
		return fmt.Sprintf("control socket %q outside the runsc root", s.controlSocket())
	}
	for _, g := range s.GoferMountConfs {
		if g.Upper != 0 {
			return "a gofer mount has an overlay (its filestore is runsc's to remove)"
		}
	}
	for _, cg := range []map[string]json.RawMessage{s.Sandbox.Cgroup, s.CompatCgroup} {
		for kind, raw := range cg {
			if owned, err := ownsCgroup(raw); err != nil || owned {
				return fmt.Sprintf("runsc may own a cgroup (%s: %s)", kind, truncate(raw, 128))
			}
		}
	}
	return ""
}

// ownsCgroup reads the "own" list of a cgroup entry of runsc's state: the
// directories runsc created and `runsc delete` removes (a list in cgroup v2,
// a map in v1). null or empty: runsc made none.
func ownsCgroup(raw json.RawMessage) (bool, error) {
	if s := strings.TrimSpace(string(raw)); s == "null" || s == "{}" {
		return false, nil
	}
	var cg struct {
		Own json.RawMessage `json:"own"`
	}
	if err := json.Unmarshal(raw, &cg); err != nil {
		return true, err
	}
	switch strings.TrimSpace(string(cg.Own)) {
	case "", "null", "[]", "{}":
		return false, nil
	}
	return true, nil
}

// procStatus is what /proc/<pid> says about a process, for deciding it is
// dead.
type procStatus struct {
	exists  bool
	zombie  bool // Z or X: exited, not yet reaped
	threads int
	kthread bool
	argv    []string
}

func readProc(pid int) (procStatus, error) {
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	b, err := os.ReadFile(filepath.Join(dir, "stat"))
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ESRCH) {
		return procStatus{}, nil
	}
	if err != nil {
		return procStatus{}, err
	}
	// "pid (comm) S ppid ... flags": comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if i < 0 || len(f) < 7 {
		return procStatus{}, fmt.Errorf("parse %s/stat: %q", dir, truncate(b, 128))
	}
	flags, err := strconv.ParseUint(f[6], 10, 64)
	if err != nil {
		return procStatus{}, fmt.Errorf("parse %s/stat flags: %w", dir, err)
	}
	const pfKthread = 0x00200000
	st := procStatus{exists: true, zombie: f[0] == "Z" || f[0] == "X", kthread: flags&pfKthread != 0}
	status, err := os.ReadFile(filepath.Join(dir, "status"))
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ESRCH) {
		return procStatus{}, nil // reaped meanwhile
	}
	if err != nil {
		return procStatus{}, err
	}
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			st.threads, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	cmd, err := os.ReadFile(filepath.Join(dir, "cmdline"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, unix.ESRCH) {
		return procStatus{}, err
	}
	if len(cmd) > 0 {
		st.argv = strings.Split(strings.TrimRight(string(cmd), "\x00"), "\x00")
	}
	return st, nil
}

// pidDead says whether pid, which runsc's state names as the sandbox or
// gofer of a container under this Root, is certainly not that process any
// more: gone, a zombie with no thread left running, a kernel thread, or a
// process whose command line is no runsc of this Root (the pid was reused).
// why tells what keeps it from being dead.
func (r *Runtime) pidDead(pid int) (dead bool, why string) {
	dead, _, why = r.pidState(pid)
	return dead, why
}

// pidState is pidDead that also says whether a pid that is not dead yet is
// on its way out (exiting: its leader or its memory is gone).
func (r *Runtime) pidState(pid int) (dead, exiting bool, why string) {
	if pid <= 0 {
		return true, false, ""
	}
	st, err := readProc(pid)
	switch {
	case err != nil:
		return false, false, err.Error()
	case !st.exists:
		return true, false, ""
	case st.zombie && st.threads <= 1:
		return true, false, ""
	case st.zombie:
		return false, true, fmt.Sprintf("pid %d: leader exited, %d threads left", pid, st.threads)
	case st.kthread:
		return true, false, ""
	case len(st.argv) == 0:
		// A user process without a command line is exiting (its memory
		// is gone): wait for it to be a zombie rather than guess.
		return false, true, fmt.Sprintf("pid %d is exiting", pid)
	case !strings.HasPrefix(filepath.Base(st.argv[0]), "runsc") || !slices.Contains(st.argv, "--root="+r.Root):
		return true, false, ""
	}
	return false, false, fmt.Sprintf("pid %d (%s) runs", pid, st.argv[0])
}

// exitSettle bounds how long removeDead waits for a pid that is on its way
// out. A killed lease's cgroup reads empty before the kernel has released
// all of a process's threads (cgroup_exit comes before the thread's
// release in do_exit), so right after cgroup.kill the sandbox's leader is
// often a zombie with threads left for a few milliseconds; seen in CI.
const exitSettle = time.Second

// pidDeadSettled is pidDead that waits, up to exitSettle, for a pid that is
// exiting to be dead.
func (r *Runtime) pidDeadSettled(pid int) (dead bool, why string) {
	deadline := time.Now().Add(exitSettle)
	for {
		dead, exiting, why := r.pidState(pid)
		if dead || !exiting || time.Now().After(deadline) {
			return dead, why
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// removeDead removes runsc's state of root container id itself when its
// processes are all dead and deleting it needs nothing else (see the
// comment at the top of this file). removed false means nothing was
// removed and why says why runsc must delete it; an error means the state
// was found dead but removing it failed part way.
func (r *Runtime) removeDead(id string) (removed bool, why string, err error) {
	if err := ValidID(id); err != nil {
		return false, err.Error(), nil
	}
	statePath := filepath.Join(r.Root, stateName(id, "state"))
	lockPath := filepath.Join(r.Root, stateName(id, "lock"))
	files, err := stateFiles(r.Root, id)
	if err != nil {
		return false, err.Error(), nil
	}
	for _, f := range files {
		if f != filepath.Base(statePath) && f != filepath.Base(lockPath) && f != controlSocketName(id) {
			return false, "unknown state file " + f, nil
		}
	}
	if !slices.Contains(files, filepath.Base(statePath)) {
		return r.removeStateless(id, files)
	}
	if why := r.knownFormat(id); why != "" {
		return false, why, nil
	}
	// runsc takes this flock for every command that loads or changes the
	// container: holding it, no runsc command is half way through it.
	lock, err := os.OpenFile(lockPath, os.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return false, fmt.Sprintf("open lock: %v", err), nil
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return false, fmt.Sprintf("lock held by a runsc command (%v)", err), nil
	}
	b, err := os.ReadFile(statePath)
	if err != nil {
		return false, fmt.Sprintf("read state: %v", err), nil
	}
	var s runscState
	if err := json.Unmarshal(b, &s); err != nil {
		return false, fmt.Sprintf("decode state: %v", err), nil
	}
	if why := s.plainDelete(r.Root, id); why != "" {
		return false, why, nil
	}
	for _, pid := range []int{s.Sandbox.Pid, s.GoferPid} {
		if dead, why := r.pidDeadSettled(pid); !dead {
			return false, why, nil
		}
	}
	// The sandbox and gofer are known by pid; exec and other runsc
	// processes of the container only by their command lines.
	procs, err := r.processes(id)
	if err != nil {
		return false, err.Error(), nil
	}
	if len(procs) > 0 {
		return false, "processes left: " + strings.Join(procs, ", "), nil
	}
	// In runsc's order: the control socket, the state, then the lock it
	// holds.
	if slices.Contains(files, controlSocketName(id)) {
		if err := os.Remove(filepath.Join(r.Root, controlSocketName(id))); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return false, "", fmt.Errorf("remove runsc control socket of %s: %w", id, err)
		}
	}
	if err := os.Remove(statePath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, "", fmt.Errorf("remove runsc state of %s: %w", id, err)
	}
	if err := os.Remove(lockPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return true, "", fmt.Errorf("remove runsc lock of %s: %w", id, err)
	}
	return true, "", nil
}

// knownFormat says why the state of container id is not in a format
// removeDead knows ("" when it is): the build that created it, as Create
// recorded it, must be one of StateFormats.
func (r *Runtime) knownFormat(id string) string {
	b, err := os.ReadFile(filepath.Join(r.ContainerLogDir(id), versionFile))
	if err != nil {
		return fmt.Sprintf("no record of the runsc build that made it (%v)", err)
	}
	v := strings.TrimSpace(string(b))
	if !slices.Contains(StateFormats, v) {
		return fmt.Sprintf("made by runsc %q, whose state files are not known", truncate(b, 64))
	}
	return ""
}

// recordVersion notes, before runsc create, which runsc build makes
// container id's state (Runtime.Version; nothing when it is not known).
func (r *Runtime) recordVersion(id string) error {
	if r.Version == "" {
		return nil
	}
	if err := os.WriteFile(filepath.Join(r.ContainerLogDir(id), versionFile), []byte(r.Version+"\n"), 0o600); err != nil {
		return fmt.Errorf("record runsc version: %w", err)
	}
	return nil
}

// removeStateless removes what a runsc killed half way through create
// leaves of container id without a state file: its .lock (runsc creates
// and flocks it before it saves the state) and a current build's control
// socket. runsc lists and deletes containers by their state file, so
// `runsc delete` calls such a container absent and leaves both, and the
// cleanup proof (CheckGone) would fail on them for ever. They are removed
// only when no process of id runs and the lock is free (no runsc command
// is half way through id), and the state is still absent under it.
func (r *Runtime) removeStateless(id string, files []string) (removed bool, why string, err error) {
	none := "no state file " + stateName(id, "state")
	if len(files) == 0 {
		return false, none, nil
	}
	procs, err := r.processes(id)
	if err != nil {
		return false, err.Error(), nil
	}
	if len(procs) > 0 {
		return false, none + "; processes left: " + strings.Join(procs, ", "), nil
	}
	lockPath := filepath.Join(r.Root, stateName(id, "lock"))
	if slices.Contains(files, filepath.Base(lockPath)) {
		lock, err := os.OpenFile(lockPath, os.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err != nil {
			return false, fmt.Sprintf("%s; open lock: %v", none, err), nil
		}
		defer lock.Close()
		if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			return false, fmt.Sprintf("%s; lock held by a runsc command (%v)", none, err), nil
		}
		if again, err := stateFiles(r.Root, id); err != nil || slices.Contains(again, stateName(id, "state")) {
			return false, "a state file appeared under the lock", nil
		}
	}
	if slices.Contains(files, controlSocketName(id)) {
		if err := os.Remove(filepath.Join(r.Root, controlSocketName(id))); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return false, "", fmt.Errorf("remove runsc control socket of %s: %w", id, err)
		}
	}
	if err := os.Remove(lockPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return true, "", fmt.Errorf("remove runsc lock of %s: %w", id, err)
	}
	r.logger().Info("removed what a runsc create killed half way left (no state file)", "container", id, "files", files)
	return true, "", nil
}
