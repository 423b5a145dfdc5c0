package lease

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containerd/cgroups/v3/cgroup2"
	"github.com/ctld/ctld/internal/logging"
	"golang.org/x/sys/unix"
)

// Defaults for the zero Manager.
const (
	DefaultRoot        = "/sys/fs/cgroup"
	DefaultParent      = "ctld.slice"
	DefaultKillTimeout = 10 * time.Second
)

// requiredControllers must be delegated to leases; optional ones are
// enabled when the kernel offers them (cpuset only matters for a Spec
// with a Cpuset, which then fails at write time without it).
var (
	requiredControllers = []string{"cpu", "memory", "pids"}
	optionalControllers = []string{"cpuset", "io"}
)

// rmdirTries bounds EBUSY retries of rmdir: a cgroup can stay busy briefly
// after its last task exited.
const rmdirTries = 8

// Manager creates and removes leases under Root/Parent. The zero value uses
// the defaults.
type Manager struct {
	Root        string // cgroup2 mount; default DefaultRoot
	Parent      string // ctld-owned parent, relative to Root; default DefaultParent
	KillTimeout time.Duration
	Logger      *slog.Logger
}

// Stats is what a lease's cgroup says about its tasks.
type Stats struct {
	Procs         int   // processes in the lease and its children
	OOMKills      int64 // memory.events oom_kill
	PIDsMaxEvents int64 // pids.events max: forks refused by pids.max
	PIDsCurrent   int64
	MemoryCurrent int64 // memory.current, bytes
	MemoryPeak    int64 // memory.peak, bytes (0 where the kernel has none)
	CPUUsageUsec  int64 // cpu.stat usage_usec
	// ThrottledUsec is cpu.stat throttled_usec: summed over the CPUs the
	// lease ran on, so it can exceed wall time.
	ThrottledUsec int64
	NrThrottled   int64 // cpu.stat nr_throttled: periods the quota ran out
}

// SetCPUMax writes the lease's cpu.max (a live change: the node lowers a
// boot allowance to the claim's share once the guest is ready) and reads
// it back.
func (m *Manager) SetCPUMax(ctx context.Context, id string, millis int64) error {
	if err := ValidateID(id); err != nil {
		return fmt.Errorf("set cpu.max: %w", err)
	}
	if millis < MinCPUMillis || millis > MaxCPUMillis {
		return fmt.Errorf("set cpu.max of %s: %w: cpu_millis %d not in [%d, %d]", id, ErrInvalid, millis, MinCPUMillis, MaxCPUMillis)
	}
	r, err := m.open()
	if err != nil {
		return fmt.Errorf("set cpu.max of %s: %w", id, err)
	}
	defer r.Close()
	name := path.Join(m.rel(id), "cpu.max")
	want := CPUMax(millis)
	if err := r.write(name, want); err != nil {
		return fmt.Errorf("set cpu.max of %s: %w", id, err)
	}
	got, err := r.read(name)
	if err != nil {
		return fmt.Errorf("set cpu.max of %s: read back: %w", id, err)
	}
	if strings.TrimSpace(got) != want {
		return fmt.Errorf("set cpu.max of %s: wrote %q, kernel has %q", id, want, strings.TrimSpace(got))
	}
	m.log().DebugContext(ctx, "lease cpu.max set", "lease", id, "cpu_millis", millis)
	return nil
}

func (m *Manager) root() string {
	if m.Root == "" {
		return DefaultRoot
	}
	return m.Root
}

func (m *Manager) parent() string {
	if m.Parent == "" {
		return DefaultParent
	}
	return m.Parent
}

func (m *Manager) log() *slog.Logger {
	return logging.OrDiscard(m.Logger)
}

func (m *Manager) killTimeout() time.Duration {
	if m.KillTimeout <= 0 {
		return DefaultKillTimeout
	}
	return m.KillTimeout
}

// open validates the parent and opens the confined root.
func (m *Manager) open() (*rootFS, error) {
	if err := validParent(m.parent()); err != nil {
		return nil, err
	}
	return openRoot(m.root())
}

// rel is a lease's path relative to Root; id must be validated.
func (m *Manager) rel(id string) string { return path.Join(m.parent(), id) }

// Dir returns the absolute cgroup directory of a lease, or "" for an
// invalid id or parent.
func (m *Manager) Dir(id string) string {
	if ValidateID(id) != nil || validParent(m.parent()) != nil {
		return ""
	}
	return filepath.Join(m.root(), m.parent(), id)
}

// CgroupsPath returns the lease as an OCI linux.cgroupsPath, or "" for an
// invalid id or parent.
func (m *Manager) CgroupsPath(id string) string {
	if ValidateID(id) != nil || validParent(m.parent()) != nil {
		return ""
	}
	return "/" + m.rel(id)
}

// Init creates the parent (and any missing ancestors) and delegates the
// lease controllers down to it. It is idempotent.
func (m *Manager) Init(ctx context.Context) error {
	r, err := m.open()
	if err != nil {
		return fmt.Errorf("init leases: %w", err)
	}
	defer r.Close()
	// Walk from the root down: each level must delegate to the next before
	// the next can delegate further.
	cur := ""
	for c := range strings.SplitSeq(m.parent(), "/") {
		if err := m.delegate(r, cur); err != nil {
			return fmt.Errorf("init leases: %w", err)
		}
		cur = path.Join(cur, c)
		if err := r.mkdir(cur); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("init leases: %w", err)
		}
	}
	if err := m.delegate(r, cur); err != nil {
		return fmt.Errorf("init leases: %w", err)
	}
	m.log().InfoContext(ctx, "lease parent ready", "dir", r.abs(cur))
	return nil
}

// delegate enables the lease controllers in rel's cgroup.subtree_control,
// writing only those not yet enabled.
func (m *Manager) delegate(r *rootFS, rel string) error {
	avail, err := r.read(path.Join(rel, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("list controllers: %w", err)
	}
	enabled, err := r.read(path.Join(rel, "cgroup.subtree_control"))
	if err != nil {
		return fmt.Errorf("list delegated controllers: %w", err)
	}
	have, on := strings.Fields(avail), strings.Fields(enabled)
	var errs []error
	for _, c := range slices.Concat(requiredControllers, optionalControllers) {
		required := slices.Contains(requiredControllers, c)
		switch {
		case slices.Contains(on, c):
			continue
		case !slices.Contains(have, c) && required:
			errs = append(errs, fmt.Errorf("controller %s not available in %s (have %q)", c, r.abs(rel), strings.TrimSpace(avail)))
			continue
		case !slices.Contains(have, c):
			m.log().Warn("optional cgroup controller unavailable", "controller", c, "dir", r.abs(rel))
			continue
		}
		if err := r.write(path.Join(rel, "cgroup.subtree_control"), "+"+c); err != nil {
			if required {
				errs = append(errs, fmt.Errorf("enable controller: %w", err))
			} else {
				m.log().Warn("optional cgroup controller not enabled", "controller", c, "err", err)
			}
		}
	}
	return errors.Join(errs...)
}

// Create makes the lease cgroup, writes its limits and reads every one back.
// A lease that already exists is a conflict (fs.ErrExist): Create never
// changes or removes a cgroup it did not make. On failure it removes the
// cgroup it made.
func (m *Manager) Create(ctx context.Context, s Spec) (err error) {
	if err := s.Validate(); err != nil {
		return fmt.Errorf("create lease: %w", err)
	}
	r, err := m.open()
	if err != nil {
		return fmt.Errorf("create lease %s: %w", s.ID, err)
	}
	defer r.Close()
	rel := m.rel(s.ID)
	if err := r.mkdir(rel); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("create lease %s: %w", s.ID, fs.ErrExist)
		}
		if errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("create lease %s: parent %s missing (Init not run?): %w", s.ID, r.abs(m.parent()), err)
		}
		return fmt.Errorf("create lease %s: %w", s.ID, err)
	}
	defer func() {
		if err != nil {
			// Nothing ran in the new cgroup yet, so a plain rmdir undoes it.
			if rerr := m.rmdirRetry(ctx, r, rel); rerr != nil {
				err = errors.Join(err, fmt.Errorf("roll back lease %s: %w", s.ID, rerr))
			}
		}
	}()
	if err := writeFiles(r, rel, s.Files()); err != nil {
		return fmt.Errorf("create lease %s: %w", s.ID, err)
	}
	m.log().InfoContext(ctx, "lease created", "lease", s.ID, "dir", r.abs(rel),
		"cpu_millis", s.CPUMillis, "memory_bytes", s.MemoryBytes, "pids", s.PIDs, "cpuset", s.Cpuset)
	return nil
}

// writeFiles writes files into the cgroup rel in write order, then reads
// each back and compares it as the kernel normalises it.
func writeFiles(r *rootFS, rel string, files map[string]string) error {
	names := sortedFiles(files)
	for _, name := range names {
		if err := r.write(path.Join(rel, name), files[name]); err != nil {
			return err
		}
	}
	page := int64(os.Getpagesize())
	var mismatch []error
	for _, name := range names {
		got, err := r.read(path.Join(rel, name))
		if err != nil {
			return fmt.Errorf("read back: %w", err)
		}
		if !sameValue(name, files[name], got, page) {
			mismatch = append(mismatch, fmt.Errorf("%s: wrote %q, kernel has %q", r.abs(path.Join(rel, name)), files[name], strings.TrimSpace(got)))
		}
	}
	if len(mismatch) > 0 {
		return fmt.Errorf("read back: %w", errors.Join(mismatch...))
	}
	return nil
}

// Remove kills everything in the lease (cgroup.kill), waits until it is
// empty and removes its cgroup, child cgroups first. A lease that is
// already gone is success.
func (m *Manager) Remove(ctx context.Context, id string) error {
	if err := ValidateID(id); err != nil {
		return fmt.Errorf("remove lease: %w", err)
	}
	r, err := m.open()
	if err != nil {
		return fmt.Errorf("remove lease %s: %w", id, err)
	}
	defer r.Close()
	if err := m.removeTree(ctx, r, m.rel(id)); err != nil {
		return fmt.Errorf("remove lease %s: %w", id, err)
	}
	m.log().InfoContext(ctx, "lease removed", "lease", id)
	return nil
}

// Kill SIGKILLs every process in lease id and its child cgroups
// (cgroup.kill) and returns once the kernel reports the lease empty, i.e.
// every one of them has exited. The lease itself stays; Remove removes it.
// A teardown kills the guest this way (sandbox, gofer, exec processes and
// log writer at once) before runsc deletes the container, so runsc finds
// nothing to kill and wait for. A lease that is gone or empty is success.
func (m *Manager) Kill(ctx context.Context, id string) error {
	if err := ValidateID(id); err != nil {
		return fmt.Errorf("kill lease: %w", err)
	}
	r, err := m.open()
	if err != nil {
		return fmt.Errorf("kill lease %s: %w", id, err)
	}
	defer r.Close()
	if _, err := m.killTree(ctx, r, m.rel(id)); err != nil {
		return fmt.Errorf("kill lease %s: %w", id, err)
	}
	return nil
}

// killTree empties the cgroup rel: cgroup.kill when populated, then a wait
// for the kernel to say it is empty. exists is false when rel is gone.
func (m *Manager) killTree(ctx context.Context, r *rootFS, rel string) (exists bool, err error) {
	populated, err := isPopulated(r, rel)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return true, err
	}
	if populated {
		// cgroup.kill SIGKILLs the whole subtree, including tasks forked
		// while it runs.
		if err := r.write(path.Join(rel, "cgroup.kill"), "1"); err != nil && !errors.Is(err, unix.ENOENT) {
			return true, fmt.Errorf("kill cgroup: %w", err)
		}
		if err := m.waitEmpty(ctx, r, rel); err != nil {
			return true, err
		}
	}
	return true, nil
}

func (m *Manager) removeTree(ctx context.Context, r *rootFS, rel string) error {
	exists, err := m.killTree(ctx, r, rel)
	if !exists || err != nil {
		return err
	}
	children, err := r.dirs(rel)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, c := range children {
		errs = append(errs, m.removeTree(ctx, r, path.Join(rel, c)))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return m.rmdirRetry(ctx, r, rel)
}

// Populated reports whether lease id exists and has processes in it
// (cgroup.events "populated 1"): a live guest's sandbox and gofer run there.
func (m *Manager) Populated(ctx context.Context, id string) (bool, error) {
	if err := ValidateID(id); err != nil {
		return false, err
	}
	r, err := m.open()
	if err != nil {
		return false, err
	}
	defer r.Close()
	ok, err := isPopulated(r, m.rel(id))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return ok, err
}

// isPopulated reads cgroup.events; populated counts the whole subtree.
func isPopulated(r *rootFS, rel string) (bool, error) {
	s, err := r.read(path.Join(rel, "cgroup.events"))
	if err != nil {
		return false, err
	}
	kv, err := parseKV(s)
	if err != nil {
		return false, fmt.Errorf("parse %s: %w", r.abs(path.Join(rel, "cgroup.events")), err)
	}
	return kv["populated"] != 0, nil
}

func (m *Manager) waitEmpty(ctx context.Context, r *rootFS, rel string) error {
	ctx, cancel := context.WithTimeout(ctx, m.killTimeout())
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		populated, err := isPopulated(r, rel)
		if errors.Is(err, unix.ENOENT) || err == nil && !populated {
			return nil
		}
		if err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s to empty after cgroup.kill: %w", r.abs(rel), ctx.Err())
		case <-tick.C:
		}
	}
}

func (m *Manager) rmdirRetry(ctx context.Context, r *rootFS, rel string) error {
	delay := 10 * time.Millisecond
	var err error
	for range rmdirTries {
		err = r.rmdir(rel)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			return err
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(delay):
		}
		delay *= 2
	}
	return fmt.Errorf("gave up after %d tries: %w", rmdirTries, err)
}

// List returns the ids of the leases that exist in the kernel, sorted.
// Directories whose names are not valid ids are not leases and are left
// out. A missing parent means no leases.
func (m *Manager) List(ctx context.Context) ([]string, error) {
	r, err := m.open()
	if err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	defer r.Close()
	dirs, err := r.dirs(m.parent())
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	var ids []string
	for _, d := range dirs {
		if ValidateID(d) == nil {
			ids = append(ids, d)
		} else {
			m.log().WarnContext(ctx, "foreign cgroup under lease parent", "name", d)
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// Stats reads task counts and limit events of a lease. A missing lease is
// an error wrapping fs.ErrNotExist.
func (m *Manager) Stats(ctx context.Context, id string) (Stats, error) {
	if err := ValidateID(id); err != nil {
		return Stats{}, fmt.Errorf("read lease stats: %w", err)
	}
	r, err := m.open()
	if err != nil {
		return Stats{}, fmt.Errorf("read lease stats %s: %w", id, err)
	}
	defer r.Close()
	rel := m.rel(id)
	if ok, err := r.exists(rel); err != nil || !ok {
		return Stats{}, fmt.Errorf("read lease stats %s: %w", id, errors.Join(err, fs.ErrNotExist))
	}
	cg, err := cgroup2.Load("/"+rel, cgroup2.WithMountpoint(m.root()))
	if err != nil {
		return Stats{}, fmt.Errorf("read lease stats %s: %w", id, err)
	}
	procs, err := cg.Procs(true)
	if err != nil {
		return Stats{}, fmt.Errorf("read lease stats %s: list procs: %w", id, err)
	}
	met, err := cg.StatFiltered(cgroup2.StatMemory | cgroup2.StatMemoryEvents | cgroup2.StatPids | cgroup2.StatCPU)
	if err != nil {
		return Stats{}, fmt.Errorf("read lease stats %s: %w", id, err)
	}
	st := Stats{Procs: len(procs)}
	if met.Memory != nil {
		st.MemoryCurrent = int64(met.Memory.Usage)
		st.MemoryPeak = int64(met.Memory.MaxUsage)
	}
	if met.MemoryEvents != nil {
		st.OOMKills = int64(met.MemoryEvents.OomKill)
	}
	if met.Pids != nil {
		st.PIDsCurrent = int64(met.Pids.Current)
	}
	if met.CPU != nil {
		st.CPUUsageUsec = int64(met.CPU.UsageUsec)
		st.ThrottledUsec = int64(met.CPU.ThrottledUsec)
		st.NrThrottled = int64(met.CPU.NrThrottled)
	}

	// The cgroups module does not read pids.events.
	ev, err := r.read(path.Join(rel, "pids.events"))
	if err != nil {
		return Stats{}, fmt.Errorf("read lease stats %s: %w", id, err)
	}
	kv, err := parseKV(ev)
	if err != nil {
		return Stats{}, fmt.Errorf("read lease stats %s: pids.events: %w", id, err)
	}
	st.PIDsMaxEvents = kv["max"]
	return st, nil
}

// CheckGone is the lease part of a cleanup proof: ok only if the lease's
// cgroup directory does not exist. detail says what was seen.
func (m *Manager) CheckGone(ctx context.Context, id string) (ok bool, detail string) {
	if err := ValidateID(id); err != nil {
		return false, err.Error()
	}
	r, err := m.open()
	if err != nil {
		return false, err.Error()
	}
	defer r.Close()
	rel := m.rel(id)
	exists, err := r.exists(rel)
	switch {
	case err != nil:
		return false, err.Error()
	case !exists:
		return true, fmt.Sprintf("cgroup %s absent", r.abs(rel))
	}
	populated, err := isPopulated(r, rel)
	if err != nil {
		return false, fmt.Sprintf("cgroup %s exists (%v)", r.abs(rel), err)
	}
	return false, fmt.Sprintf("cgroup %s exists (populated=%t)", r.abs(rel), populated)
}
