package mountinfo

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
)

// ProcRoot is where procfs is normally mounted.
const ProcRoot = "/proc"

// Namespace is the mount table of one mount namespace, read through one
// of the processes in it.
type Namespace struct {
	ID     string // e.g. "mnt:[4026531841]" (readlink of /proc/PID/ns/mnt)
	PID    int    // the process it was read through
	Mounts []Mount
}

// AllNamespaces reads the mount table of every mount namespace that has a
// process under proc (normally ProcRoot), once per namespace, in pid
// order. A mount that only some other namespace still has (a copy made by
// unshare(CLONE_NEWNS) before an unmount did not propagate) is visible
// only here, not in /proc/self/mountinfo. Processes that exit while it
// reads are skipped; any other error is returned, so a caller proving
// absence fails closed.
func AllNamespaces(proc string) ([]Namespace, error) {
	pids, err := Pids(proc)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []Namespace
	for _, pid := range pids {
		dir := filepath.Join(proc, strconv.Itoa(pid))
		id, err := os.Readlink(filepath.Join(dir, "ns", "mnt"))
		if err != nil {
			if Vanished(err) {
				continue
			}
			return nil, fmt.Errorf("read mount namespace of pid %d: %w", pid, err)
		}
		if seen[id] {
			continue
		}
		ms, err := ReadFile(filepath.Join(dir, "mountinfo"))
		if err != nil {
			if Vanished(err) {
				continue
			}
			return nil, fmt.Errorf("read mounts of pid %d: %w", pid, err)
		}
		seen[id] = true
		out = append(out, Namespace{ID: id, PID: pid, Mounts: ms})
	}
	return out, nil
}

// Pids lists the processes under proc, sorted.
func Pids(proc string) ([]int, error) {
	ents, err := os.ReadDir(proc)
	if err != nil {
		return nil, fmt.Errorf("list processes in %s: %w", proc, err)
	}
	var out []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil && pid > 0 {
			out = append(out, pid)
		}
	}
	sort.Ints(out)
	return out, nil
}

// Vanished reports whether err from reading /proc/PID/... means the
// process exited meanwhile (or is a zombie without namespaces).
func Vanished(err error) bool {
	return errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) || errors.Is(err, syscall.EINVAL)
}
