// Package holders finds the processes that keep a kernel object alive
// after its name is gone: a filesystem whose mount was lazily detached
// lives while a process has its cwd, root or an open file in it; a
// network namespace whose bind mount was removed lives while a thread is
// in it or a process holds an fd to it. The cleanup proof uses these to
// check the object itself, not only its name.
package holders

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/mountinfo"
)

// Ref is one process's reference to the object.
type Ref struct {
	PID  int
	Via  string // "cwd", "root", "fd 3", "task 12 ns/net"
	Path string // the /proc path that refers to it, openable while the process lives
	// Who is the process's name, state and cgroup when it was found
	// ("runsc-gofer, state S, cgroup /x.slice"): a holder outside any
	// lease is otherwise hard to name once it is gone.
	Who string
}

func (r Ref) String() string {
	if r.Who == "" {
		return fmt.Sprintf("pid %d (%s)", r.PID, r.Via)
	}
	return fmt.Sprintf("pid %d (%s; %s)", r.PID, r.Via, r.Who)
}

// who describes process dir (a /proc/<pid> directory): its comm, state
// and cgroup v2 path, what of them could be read.
func who(dir string) string {
	var parts []string
	if b, err := os.ReadFile(filepath.Join(dir, "stat")); err == nil {
		// "pid (comm) S ...": comm may hold spaces and parentheses.
		st := string(b)
		if i, j := strings.IndexByte(st, '('), strings.LastIndexByte(st, ')'); i >= 0 && j > i {
			parts = append(parts, st[i+1:j])
			if f := strings.Fields(st[j+1:]); len(f) > 0 {
				parts = append(parts, "state "+f[0])
			}
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "cgroup")); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if p, ok := strings.CutPrefix(l, "0::"); ok {
				parts = append(parts, "cgroup "+p)
			}
		}
	}
	return strings.Join(parts, ", ")
}

// Files lists the processes under proc (normally /proc) whose cwd, root
// or an open file is on the filesystem with device number dev (st_dev).
func Files(proc string, dev uint64) ([]Ref, error) {
	pids, err := mountinfo.Pids(proc)
	if err != nil {
		return nil, err
	}
	var out []Ref
	for _, pid := range pids {
		dir := filepath.Join(proc, strconv.Itoa(pid))
		for _, via := range []string{"cwd", "root"} {
			p := filepath.Join(dir, via)
			if st, ok := stat(p); ok && st.Dev == dev {
				out = append(out, Ref{PID: pid, Via: via, Path: p, Who: who(dir)})
			}
		}
		refs, err := fds(dir, pid, func(st *unix.Stat_t) bool { return st.Dev == dev })
		if err != nil {
			return nil, err
		}
		out = append(out, refs...)
	}
	return out, nil
}

// Namespace lists the threads under proc that are in the namespace of
// type typ ("net", "mnt", ...) with nsfs device dev and inode ino, and the
// processes that hold an open fd to it. Mounts of it (a bind mount of an
// nsfs file) are in mountinfo: see mountinfo.AllNamespaces.
func Namespace(proc, typ string, dev, ino uint64) ([]Ref, error) {
	pids, err := mountinfo.Pids(proc)
	if err != nil {
		return nil, err
	}
	match := func(st *unix.Stat_t) bool { return st.Dev == dev && st.Ino == ino }
	var out []Ref
	for _, pid := range pids {
		dir := filepath.Join(proc, strconv.Itoa(pid))
		// Threads can sit in another namespace than their leader (setns
		// on one locked thread), so every task is looked at.
		tasks, err := mountinfo.Pids(filepath.Join(dir, "task"))
		if err != nil {
			if mountinfo.Vanished(err) {
				continue
			}
			return nil, err
		}
		for _, tid := range tasks {
			p := filepath.Join(dir, "task", strconv.Itoa(tid), "ns", typ)
			if st, ok := stat(p); ok && match(st) {
				out = append(out, Ref{PID: pid, Via: fmt.Sprintf("task %d ns/%s", tid, typ), Path: p, Who: who(dir)})
			}
		}
		refs, err := fds(dir, pid, match)
		if err != nil {
			return nil, err
		}
		out = append(out, refs...)
	}
	return out, nil
}

// fds lists the open fds of process dir whose target matches.
func fds(dir string, pid int, match func(*unix.Stat_t) bool) ([]Ref, error) {
	fdDir := filepath.Join(dir, "fd")
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		if mountinfo.Vanished(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("list fds of pid %d: %w", pid, err)
	}
	var out []Ref
	for _, e := range ents {
		p := filepath.Join(fdDir, e.Name())
		if st, ok := stat(p); ok && match(st) {
			out = append(out, Ref{PID: pid, Via: "fd " + e.Name(), Path: p, Who: who(dir)})
		}
	}
	return out, nil
}

// stat follows a /proc magic link to the object itself (stat, not lstat).
// A reference that vanished meanwhile is no reference.
func stat(p string) (*unix.Stat_t, bool) {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return nil, false
	}
	return &st, true
}
