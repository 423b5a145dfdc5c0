// Package lease manages cgroup v2 resource leases: one cgroup per lease under
// a ctld-owned parent (default ctld.slice), with CPU, memory, PID and cpuset
// limits that are written, read back and proven gone on removal.
package lease

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/ctld/ctld/internal/names"
)

// ErrInvalid marks a Spec or id that fails validation (wire code
// invalid_argument).
var ErrInvalid = errors.New("invalid lease")

// Limits the kernel (or common sense) puts on a lease.
const (
	// MinCPUMillis is the smallest CPU share: the kernel refuses a cpu.max
	// quota under 1000us, and quota = millis*100.
	MinCPUMillis = 10
	// MaxCPUMillis keeps quota arithmetic far from overflow (1000 CPUs).
	MaxCPUMillis = 1_000_000
	// MinMemoryBytes is the smallest memory.max worth leasing; anything
	// smaller cannot even start a process.
	MinMemoryBytes = 1 << 20
	// MaxMemoryBytes is far above any host and far from overflow (16 TiB).
	MaxMemoryBytes = 16 << 40
	// MaxCpusetLen bounds a cpuset list before it is parsed.
	MaxCpusetLen = 256
	// MaxPIDs is the kernel's PID_MAX_LIMIT; pids.max refuses more.
	MaxPIDs = 4 << 20
	// maxCPU bounds cpuset CPU numbers (the kernel's NR_CPUS ceiling).
	maxCPU = 8192
	// cpuPeriod is the cpu.max period in microseconds.
	cpuPeriod = 100000
)

// Spec describes one lease as plain data.
type Spec struct {
	ID          string
	CPUMillis   int64  // CPU time per wall second, in thousandths of a CPU
	MemoryBytes int64  // memory.max; swap is always 0
	PIDs        int64  // pids.max
	Cpuset      string // optional cpuset.cpus list, e.g. "0-1,3"
	// BootCPUMillis, when above CPUMillis, is cpu.max while the guest
	// boots (runsc's sentry, gofer and the agent start inside the lease):
	// a boot throttled to a small workload's share took minutes and failed
	// its readiness bound. The node lowers cpu.max to CPUMillis (SetCPUMax)
	// before it publishes the generation ready. cpu.weight always follows
	// CPUMillis, so boots compete for the node's CPU in proportion to their
	// leases. 0: no boot allowance.
	BootCPUMillis int64
}

// ValidateID checks that id can safely become a cgroup directory name:
// the one ID rule of package names.
func ValidateID(id string) error {
	if !names.Valid(id) {
		return fmt.Errorf("%w: id %q %s", ErrInvalid, id, names.Rule)
	}
	return nil
}

// Validate checks the id pattern and that every limit is in range.
func (s Spec) Validate() error {
	var errs []error
	if err := ValidateID(s.ID); err != nil {
		errs = append(errs, err)
	}
	if s.CPUMillis < MinCPUMillis || s.CPUMillis > MaxCPUMillis {
		errs = append(errs, fmt.Errorf("%w: cpu_millis %d not in [%d, %d]", ErrInvalid, s.CPUMillis, MinCPUMillis, MaxCPUMillis))
	}
	if s.MemoryBytes < MinMemoryBytes || s.MemoryBytes > MaxMemoryBytes {
		errs = append(errs, fmt.Errorf("%w: memory_bytes %d not in [%d, %d]", ErrInvalid, s.MemoryBytes, int64(MinMemoryBytes), int64(MaxMemoryBytes)))
	}
	if s.BootCPUMillis != 0 && (s.BootCPUMillis < MinCPUMillis || s.BootCPUMillis > MaxCPUMillis) {
		errs = append(errs, fmt.Errorf("%w: boot cpu_millis %d not in [%d, %d]", ErrInvalid, s.BootCPUMillis, MinCPUMillis, MaxCPUMillis))
	}
	if s.PIDs < 1 || s.PIDs > MaxPIDs {
		errs = append(errs, fmt.Errorf("%w: pids %d not in [1, %d]", ErrInvalid, s.PIDs, MaxPIDs))
	}
	if s.Cpuset != "" {
		if err := ValidateCpuset(s.Cpuset); err != nil {
			errs = append(errs, fmt.Errorf("%w: cpuset: %w", ErrInvalid, err))
		}
	}
	return errors.Join(errs...)
}

// Weight maps CPU millis to cpu.weight: 1000m (one CPU) is the default
// weight 100, so leases compete in proportion to what they were given.
func Weight(millis int64) int64 {
	return min(max(millis/10, 1), 10000)
}

// CPUMax renders millis as a cpu.max value (quota and period, in us).
func CPUMax(millis int64) string {
	return fmt.Sprintf("%d %d", millis*cpuPeriod/1000, cpuPeriod)
}

// Files renders the Spec as the cgroup files and values to write. Call
// Validate first; Files does not check.
func (s Spec) Files() map[string]string {
	f := map[string]string{
		"cpu.max":         CPUMax(max(s.CPUMillis, s.BootCPUMillis)),
		"cpu.weight":      strconv.FormatInt(Weight(s.CPUMillis), 10),
		"memory.max":      strconv.FormatInt(s.MemoryBytes, 10),
		"memory.swap.max": "0",
		"pids.max":        strconv.FormatInt(s.PIDs, 10),
	}
	if s.Cpuset != "" {
		f["cpuset.cpus"] = s.Cpuset
	}
	return f
}

// fileOrder is the order Create writes files in: cpuset first so a bad CPU
// list fails before anything else is limited.
var fileOrder = []string{"cpuset.cpus", "cpu.max", "cpu.weight", "memory.max", "memory.swap.max", "pids.max"}

// sortedFiles returns the names of files in write order.
func sortedFiles(files map[string]string) []string {
	var out []string
	for _, name := range fileOrder {
		if _, ok := files[name]; ok {
			out = append(out, name)
		}
	}
	var rest []string
	for name := range files {
		if !slices.Contains(fileOrder, name) {
			rest = append(rest, name)
		}
	}
	slices.Sort(rest)
	return append(out, rest...)
}

// sameValue reports whether the kernel's read-back got equals what was
// written. The kernel normalises some values: memory limits are rounded down
// to whole pages and CPU lists are printed as ranges.
func sameValue(name, want, got string, pageSize int64) bool {
	want, got = strings.TrimSpace(want), strings.TrimSpace(got)
	switch name {
	case "memory.max", "memory.swap.max", "memory.high", "memory.low", "memory.min":
		w, err1 := strconv.ParseInt(want, 10, 64)
		g, err2 := strconv.ParseInt(got, 10, 64)
		if err1 != nil || err2 != nil {
			return want == got
		}
		return g == w-w%pageSize
	case "cpuset.cpus", "cpuset.mems":
		w, err1 := ParseCPUList(want)
		g, err2 := ParseCPUList(got)
		return err1 == nil && err2 == nil && slices.Equal(w, g)
	}
	return want == got
}

// ValidateCpuset checks a requested cpuset.cpus list ("0-3,8"): bounded in
// length, then parsed by the one CPU list parser. The API validates a
// claim's cpuset with it, so the API and the lease agree.
func ValidateCpuset(s string) error {
	if len(s) > MaxCpusetLen {
		return fmt.Errorf("longer than %d bytes", MaxCpusetLen)
	}
	_, err := ParseCPUList(s)
	return err
}

// ParseCPUList parses a kernel CPU list ("0-2,5") into sorted unique CPUs.
func ParseCPUList(s string) ([]int, error) {
	if s == "" {
		return nil, errors.New("empty cpu list")
	}

	var cpus []int
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := parseCPU(lo)
		if err != nil {
			return nil, err
		}
		b := a
		if isRange {
			if b, err = parseCPU(hi); err != nil {
				return nil, err
			}
			if b < a {
				return nil, fmt.Errorf("cpu range %q is backwards", part)
			}
		}
		for c := a; c <= b; c++ {
			cpus = append(cpus, c)
		}
	}
	slices.Sort(cpus)
	return slices.Compact(cpus), nil
}

func parseCPU(s string) (int, error) {
	// Digits only: Atoi alone would accept "+1" and "-0".
	if s == "" || strings.Trim(s, "0123456789") != "" {
		return 0, fmt.Errorf("cpu %q is not a number", s)
	}
	n, err := strconv.Atoi(s)
	if err != nil || n >= maxCPU {
		return 0, fmt.Errorf("cpu %q out of range [0, %d)", s, maxCPU)
	}
	return n, nil
}

// parseKV parses a flat-keyed cgroup file ("oom_kill 3\nmax 0\n").
func parseKV(s string) (map[string]int64, error) {
	out := map[string]int64{}
	for line := range strings.SplitSeq(strings.TrimSpace(s), "\n") {
		if line == "" {
			continue
		}
		k, v, ok := strings.Cut(line, " ")
		if !ok {
			return nil, fmt.Errorf("parse %q: want \"key value\"", line)
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("parse %q: %w", line, err)
		}
		out[k] = n
	}
	return out, nil
}

// validParent checks the parent path relative to the cgroup root: clean
// components of safe characters, no "." or "..".
func validParent(p string) error {
	if p == "" || strings.HasPrefix(p, "/") {
		return fmt.Errorf("%w: parent %q must be a relative cgroup path", ErrInvalid, p)
	}
	for c := range strings.SplitSeq(p, "/") {
		if !parentComponent.MatchString(c) {
			return fmt.Errorf("%w: parent %q has bad component %q", ErrInvalid, p, c)
		}
	}
	return nil
}

var parentComponent = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._@-]{0,127}$`)
