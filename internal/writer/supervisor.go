package writer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/logging"
	"github.com/ctld/ctld/internal/nbdsrv"
)

// Supervisor starts, stops, adopts and checks writer processes: the
// primary's side of the contract. It keeps no state a restart would lose:
// everything is read back from each Dir (state file, lock) and /proc.
type Supervisor struct {
	Binary string // the ctld binary, run as `Binary writer --spec FILE`
	Root   string // parent of every Spec.Dir (List walks it)
	Cgroup string // cgroup v2 directory the writers run in (ctld-owned: Start makes it, Stop removes it once empty)
	// Env is added to each writer's environment: the S3 credentials of a
	// store whose settings name no credentials file (a process's
	// environment is readable by its user only, its argv by all).
	Env    []string
	Logger *slog.Logger

	mu     sync.Mutex
	exited map[int]chan struct{} // writers this Supervisor started, closed once reaped
	// cgMu orders Start's mkdir-and-clone into Cgroup with Stop's rmdir
	// of it, so a writer is never started into a removed cgroup.
	cgMu sync.Mutex
}

// Bounds of the supervisor's waits.
const (
	stopGrace = 45 * time.Second // SIGTERM → exit (disconnect + quiescence inside)
	killWait  = 10 * time.Second // SIGKILL → gone
	pollEvery = 20 * time.Millisecond
	// dyingWait bounds the wait for a dying writer to release its lock.
	dyingWait = 2 * time.Second
	logTail   = 2048
)

func (s *Supervisor) log() *slog.Logger { return logging.OrDiscard(s.Logger) }

// inRoot refuses a dir outside Root: the supervisor only touches its own.
func (s *Supervisor) inRoot(dir string) error {
	rel, err := filepath.Rel(s.Root, dir)
	if s.Root == "" || err != nil || rel == "." || strings.HasPrefix(rel, "..") || !filepath.IsAbs(dir) {
		return fmt.Errorf("%w: dir %q is not under the writers' root %q", ErrInvalidSpec, dir, s.Root)
	}
	return nil
}

// Start writes Dir/spec.json, starts the writer (own session, in Cgroup)
// and waits, bounded by ctx, until its State with spec.Epoch appears or it
// exits (its log's tail in the error).
func (s *Supervisor) Start(ctx context.Context, spec Spec) (State, error) {
	if err := spec.Check(); err != nil {
		return State{}, err
	}
	if err := s.inRoot(spec.Dir); err != nil {
		return State{}, err
	}
	if s.Binary == "" || s.Cgroup == "" {
		return State{}, errors.New("writer supervisor: Binary and Cgroup are required")
	}
	// A live writer is refused before anything in its Dir is touched (it
	// would refuse too, holding the lock).
	if pid, err := s.settledLockHolder(ctx, filepath.Join(spec.Dir, LockName)); err != nil {
		return State{}, err
	} else if pid != 0 {
		return State{}, fmt.Errorf("start writer %s: %w (pid %d)", spec.Dir, ErrBusy, pid)
	}
	if err := os.MkdirAll(spec.Dir, 0o700); err != nil {
		return State{}, fmt.Errorf("start writer: %w", err)
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return State{}, err
	}
	specFile := filepath.Join(spec.Dir, SpecName)
	if err := writeFileAtomic(specFile, b); err != nil {
		return State{}, fmt.Errorf("start writer: %w", err)
	}
	logPath := filepath.Join(spec.Dir, LogName)
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return State{}, fmt.Errorf("start writer: %w", err)
	}
	defer logf.Close()
	logStart, _ := logf.Seek(0, io.SeekEnd)
	cmd := exec.Command(s.Binary, "writer", "--spec", specFile)
	cmd.Stdout, cmd.Stderr = logf, logf // stdin: /dev/null
	cmd.Env = append([]string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, s.Env...)
	if err := s.startInCgroup(cmd); err != nil {
		return State{}, fmt.Errorf("start writer %s: %w", spec.Dir, err)
	}
	pid := cmd.Process.Pid
	exited := make(chan struct{})
	var werr error
	go func() { werr = cmd.Wait(); close(exited) }()
	s.mu.Lock()
	if s.exited == nil {
		s.exited = map[int]chan struct{}{}
	}
	s.exited[pid] = exited
	s.mu.Unlock()
	go func() {
		<-exited
		s.mu.Lock()
		delete(s.exited, pid)
		s.mu.Unlock()
	}()
	log := s.log().With("dir", spec.Dir, "pid", pid, "epoch", spec.Epoch)
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for {
		if st, err := readState(spec.Dir); err == nil && st.Epoch == spec.Epoch && st.PID == pid {
			log.Info("writer started", "device", st.Device, "size", st.Size)
			return st, nil
		}
		select {
		case <-exited:
			tail := readTail(logPath, logStart)
			var ee *exec.ExitError
			var kind error = errors.New("writer exited")
			if errors.As(werr, &ee) {
				switch ee.ExitCode() {
				case ExitBusy:
					kind = ErrBusy
				case ExitStale:
					kind = ErrStaleEpoch
				case ExitNoReattach:
					kind = ErrNoReattach
				}
			}
			return State{}, fmt.Errorf("start writer %s: %w (%v): %s", spec.Dir, kind, werr, tail)
		case <-ctx.Done():
			// Not started in time: stop it (it disconnects what it
			// attached), so nothing half-attached stays behind.
			log.Warn("writer did not come up in time; stopping it")
			_ = s.stopPID(context.Background(), pid, State{PID: pid})
			return State{}, fmt.Errorf("start writer %s: %w: %s", spec.Dir, ctx.Err(), readTail(logPath, logStart))
		case <-t.C:
		}
	}
}

// settledLockHolder is lockHolder once a dying holder has let go: a
// killed writer's leader turns zombie (Check: ErrNotRunning) while its
// other threads, which share its file table and so its flock, are still
// on their way out. A holder that is not dying is returned at once.
func (s *Supervisor) settledLockHolder(ctx context.Context, lock string) (int, error) {
	deadline := time.Now().Add(dyingWait)
	for {
		pid, err := lockHolder(lock)
		if err != nil || pid == 0 || !dying(pid) || time.Now().After(deadline) {
			return pid, err
		}
		select {
		case <-ctx.Done():
			return pid, nil
		case <-time.After(pollEvery):
		}
	}
}

// startInCgroup starts cmd in its own session and in Cgroup (made if
// missing). Own session: no terminal or process-group signal of the
// primary's reaches it; own cgroup: systemd's stop of ctld@
// (KillMode=process) and a lease removal do not kill it.
func (s *Supervisor) startInCgroup(cmd *exec.Cmd) error {
	s.cgMu.Lock()
	defer s.cgMu.Unlock()
	if err := os.MkdirAll(s.Cgroup, 0o755); err != nil {
		return fmt.Errorf("cgroup: %w", err)
	}
	cg, err := unix.Open(s.Cgroup, unix.O_DIRECTORY|unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open cgroup %s: %w", s.Cgroup, err)
	}
	defer unix.Close(cg)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, UseCgroupFD: true, CgroupFD: cg}
	return cmd.Start()
}

// tidyCgroup removes Cgroup once no writer runs in it: the supervisor
// owns it, and a node with no block generation keeps no cgroup of its
// own (the next Start makes it again). EBUSY is a writer still in it.
func (s *Supervisor) tidyCgroup() {
	s.cgMu.Lock()
	defer s.cgMu.Unlock()
	if s.Cgroup == "" {
		return
	}
	if err := unix.Rmdir(s.Cgroup); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EBUSY) {
		s.log().Warn("remove the writers' cgroup", "cgroup", s.Cgroup, "err", err)
	}
}

// readTail returns at most logTail bytes of what was appended to the log
// since off.
func readTail(path string, off int64) string {
	b, err := os.ReadFile(path)
	if err != nil || int64(len(b)) < off {
		return "(no log)"
	}
	b = b[off:]
	if len(b) > logTail {
		b = b[len(b)-logTail:]
	}
	return strings.TrimSpace(string(b))
}

// Check returns the running writer's State: its pid (with its start time)
// alive, holding the Dir's lock, and of the epoch of the Dir's last spec;
// else ErrNotRunning.
func (s *Supervisor) Check(ctx context.Context, dir string) (State, error) {
	if err := s.inRoot(dir); err != nil {
		return State{}, err
	}
	st, err := readState(dir)
	if errors.Is(err, os.ErrNotExist) {
		return State{}, fmt.Errorf("%w: %s: no state file", ErrNotRunning, dir)
	}
	if err != nil {
		return State{}, err
	}
	if !alive(st.PID, st.StartTime) {
		return State{}, fmt.Errorf("%w: %s: pid %d (epoch %d) is gone", ErrNotRunning, dir, st.PID, st.Epoch)
	}
	holder, err := lockHolder(filepath.Join(dir, LockName))
	if err != nil {
		return State{}, err
	}
	if holder != st.PID {
		return State{}, fmt.Errorf("%w: %s: pid %d does not hold the lock (holder %d)", ErrNotRunning, dir, st.PID, holder)
	}
	spec, err := readSpec(filepath.Join(dir, SpecName))
	if err != nil {
		return State{}, fmt.Errorf("%w: %s: %v", ErrNotRunning, dir, err)
	}
	if st.Epoch != spec.Epoch {
		return State{}, fmt.Errorf("%w: %s: the writer is of epoch %d, the last attach of epoch %d", ErrNotRunning, dir, st.Epoch, spec.Epoch)
	}
	return st, nil
}

// Stop ends the Dir's writer: SIGTERM and a wait for it to disconnect and
// exit; SIGKILL after a bounded wait, then it disconnects the device
// itself. No writer (and no device left by one) is nil. The writers'
// cgroup is removed once no writer is left in it.
func (s *Supervisor) Stop(ctx context.Context, dir string) error {
	if err := s.inRoot(dir); err != nil {
		return err
	}
	st, err := readState(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	pid := 0
	if err == nil && alive(st.PID, st.StartTime) {
		pid = st.PID
	} else if h, herr := lockHolder(filepath.Join(dir, LockName)); herr != nil {
		return herr
	} else {
		pid = h // a writer still starting (no state yet), or none
	}
	if pid != 0 {
		if err := s.stopPID(ctx, pid, st); err != nil {
			return fmt.Errorf("stop writer %s: %w", dir, err)
		}
	} else if err == nil {
		// A writer that died (kill -9) leaves its device configured.
		if err := disconnectStale(ctx, st); err != nil {
			return fmt.Errorf("stop writer %s: %w", dir, err)
		}
	}
	if err := removeDurable(filepath.Join(dir, StateName)); err != nil {
		return fmt.Errorf("stop writer %s: %w", dir, err)
	}
	s.tidyCgroup()
	return nil
}

// stopPID signals pid (SIGTERM, then SIGKILL) and waits until it is gone;
// after a SIGKILL it disconnects the device st names if still the writer's.
func (s *Supervisor) stopPID(ctx context.Context, pid int, st State) error {
	_, start, err := procStat("/proc", pid)
	if err != nil {
		return nil // already gone
	}
	log := s.log().With("pid", pid)
	if err := unix.Kill(pid, unix.SIGTERM); err != nil && !errors.Is(err, unix.ESRCH) {
		return err
	}
	gctx, cancel := context.WithTimeout(ctx, stopGrace)
	defer cancel()
	if s.waitGone(gctx, pid, start) {
		return nil
	}
	log.Warn("writer ignored SIGTERM; killing it", "grace", stopGrace)
	if alive(pid, start) {
		_ = unix.Kill(pid, unix.SIGKILL)
	}
	kctx, kcancel := context.WithTimeout(context.Background(), killWait)
	defer kcancel()
	if !s.waitGone(kctx, pid, start) {
		return fmt.Errorf("writer pid %d survived SIGKILL for %v", pid, killWait)
	}
	return disconnectStale(ctx, st)
}

// waitGone polls until pid (with start time start) is gone or a zombie;
// a writer this Supervisor started is also reaped.
func (s *Supervisor) waitGone(ctx context.Context, pid int, start uint64) bool {
	s.mu.Lock()
	exited := s.exited[pid]
	s.mu.Unlock()
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for {
		if exited != nil {
			select {
			case <-exited:
				return true
			default:
			}
		} else if !alive(pid, start) {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}

// disconnectStale disconnects the device of a dead writer when the
// device's pid still names it (otherwise the device is another's now).
func disconnectStale(ctx context.Context, st State) error {
	if st.DevicePID == 0 {
		return nil
	}
	dpid, err := devicePID(sysBlock, st.Index)
	if err != nil || dpid != st.DevicePID {
		return err
	}
	devs, err := nbdsrv.OpenDevices()
	if err != nil {
		return err
	}
	defer devs.Close()
	if err := devs.Disconnect(st.Index); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, quiesceTimeout)
	defer cancel()
	_, err = nbdsrv.WaitQuiescent(wctx, devs, sysBlock, st.Index)
	return err
}

// CheckGone is the cleanup proof's check: no writer process for dir, and
// /dev/nbd<index> quiescent (not connected, size 0, no holders, inflight
// 0, pid gone).
func (s *Supervisor) CheckGone(ctx context.Context, dir string, index int) (bool, string) {
	if err := s.inRoot(dir); err != nil {
		return false, err.Error()
	}
	if st, err := readState(dir); err == nil && alive(st.PID, st.StartTime) {
		return false, fmt.Sprintf("writer pid %d (epoch %d) still runs for %s", st.PID, st.Epoch, dir)
	}
	if h, err := lockHolder(filepath.Join(dir, LockName)); err != nil {
		return false, err.Error()
	} else if h != 0 {
		return false, fmt.Sprintf("pid %d holds %s", h, filepath.Join(dir, LockName))
	}
	if index < 0 {
		return true, "no writer; no device attached"
	}
	devs, err := nbdsrv.OpenDevices()
	if err != nil {
		return false, err.Error()
	}
	defer devs.Close()
	q, err := nbdsrv.ReadQuiescence(devs, sysBlock, index)
	if err != nil {
		return false, err.Error()
	}
	if !q.Quiet() {
		return false, fmt.Sprintf("nbd%d not quiescent: %s", index, q)
	}
	return true, fmt.Sprintf("no writer; nbd%d quiescent", index)
}

// List returns the dirs under Root with a live writer or a state file.
func (s *Supervisor) List(ctx context.Context) ([]string, error) {
	ents, err := os.ReadDir(s.Root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list writers: %w", err)
	}
	var out []string
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(s.Root, e.Name())
		if _, err := os.Stat(filepath.Join(dir, StateName)); err == nil {
			out = append(out, dir)
			continue
		}
		if h, err := lockHolder(filepath.Join(dir, LockName)); err == nil && h != 0 {
			out = append(out, dir)
		}
	}
	return out, nil
}
