// Package netpolicy gives each sandbox its network. For now that is a
// named network namespace with only loopback up and no route out (the
// deny_all mode); the veth pair, addresses and nftables policy build on
// the same Netns.
package netpolicy

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/logging"
	"github.com/ctld/ctld/internal/mountinfo"
	"github.com/ctld/ctld/internal/names"
)

// Defaults of Netns. /run/netns is where iproute2 looks, so operators can
// inspect a sandbox with `ip netns exec ctld-<id> ...`.
const (
	DefaultDir    = "/run/netns"
	DefaultPrefix = "ctld-"
)

// Netns manages named network namespaces: each is a bind mount of a
// namespace file at Dir/<Prefix><name>, which keeps the namespace alive
// without a process in it and gives runsc a path to join.
//
// Calls for the same name must not run concurrently; the node serializes
// work per sandbox.
type Netns struct {
	Dir    string // default DefaultDir
	Prefix string // default DefaultPrefix
	Logger *slog.Logger
	// MountinfoPath is where mounts are read from; empty means
	// mountinfo.SelfPath.
	MountinfoPath string
	// ProcRoot is where every process's namespaces, fds and mounts are
	// looked at for the cleanup proof; empty means /proc.
	ProcRoot string
}

func (n *Netns) dir() string {
	if n.Dir == "" {
		return DefaultDir
	}
	return filepath.Clean(n.Dir)
}

func (n *Netns) prefix() string {
	if n.Prefix == "" {
		return DefaultPrefix
	}
	return n.Prefix
}

func (n *Netns) logger() *slog.Logger {
	return logging.OrDiscard(n.Logger)
}

// Path is the namespace file of name (it may not exist).
func (n *Netns) Path(name string) string {
	return filepath.Join(n.dir(), n.prefix()+name)
}

// Prepare makes Dir a mount point of its own with shared propagation, as
// `ip netns add` does on its first use. Run once at ctld's start, before
// any Create: were Dir no mount point, a later `ip netns add` by an
// operator would bind-mount Dir over itself (recursively), so the netns
// files ctld mounted before sit hidden under copies; unmounting a copy
// no longer frees the namespace and the release's netns_gone check
// fails. With Dir already a mount point, iproute2 only makes it shared
// again. Idempotent. A Dir that is no mount point but already holds
// mounts (namespaces of a ctld before this one) is left alone with a
// warning: binding it now would hide them just the same.
func (n *Netns) Prepare(ctx context.Context) error {
	dir := n.dir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("make netns dir: %w", err)
	}
	// mountinfo shows resolved paths (/var/run/netns is /run/netns).
	resolved, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return fmt.Errorf("resolve netns dir: %w", err)
	}
	mp := n.MountinfoPath
	if mp == "" {
		mp = mountinfo.SelfPath
	}
	ms, err := mountinfo.ReadFile(mp)
	if err != nil {
		return err
	}
	if len(mountinfo.At(ms, resolved)) == 0 {
		if below := mountinfo.Under(ms, resolved); len(below) > 0 {
			n.logger().Warn("netns dir is no mount point but holds mounts: left as it is, so `ip netns add` on this host hides them (reboot, or release them, to fix)",
				"dir", resolved, "mounts", len(below), "first", below[0].MountPoint)
			return nil
		}
		if err := unix.Mount(resolved, resolved, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind-mount netns dir %s over itself: %w", resolved, err)
		}
		n.logger().Info("netns dir made a mount point", "dir", resolved)
	}
	if err := unix.Mount("", resolved, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make netns dir %s shared: %w", resolved, err)
	}
	return nil
}

func validateName(name string) error { return names.CheckID("netns name", name) }

// Create makes the named namespace with loopback up and returns its path.
// It is idempotent: an existing namespace is returned as is (after making
// sure lo is up); a leftover plain file from an interrupted Create is
// mounted over.
func (n *Netns) Create(ctx context.Context, name string) (path string, err error) {
	if err := validateName(name); err != nil {
		return "", err
	}
	p := n.Path(name)
	log := n.logger().With("netns", name, "path", p)
	if err := os.MkdirAll(n.dir(), 0o755); err != nil {
		return "", fmt.Errorf("make netns dir: %w", err)
	}
	is, err := isNetnsFile(p)
	if err != nil {
		return "", err
	}
	if !is {
		if err := ctx.Err(); err != nil {
			return "", fmt.Errorf("create netns %s: %w", name, err)
		}
		if err := newNamed(p); err != nil {
			return "", err
		}
		log.Info("netns created")
	}
	if err := loUp(p); err != nil {
		if is {
			return "", err
		}
		// Roll back what this call made, so a failed Create leaves nothing.
		return "", errors.Join(err, n.Delete(ctx, name))
	}
	return p, nil
}

// isNetnsFile reports whether p is a mounted network namespace file. A
// plain file is not (false); a mounted namespace of another type is a
// conflict, not something to mount over.
func isNetnsFile(p string) (bool, error) {
	var st unix.Statfs_t
	err := unix.Statfs(p, &st)
	switch {
	case errors.Is(err, unix.ENOENT):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("statfs %s: %w", p, err)
	case st.Type != unix.NSFS_MAGIC:
		return false, nil
	}
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, fmt.Errorf("open %s: %w", p, err)
	}
	defer unix.Close(fd)
	typ, err := unix.IoctlRetInt(fd, unix.NS_GET_NSTYPE)
	if err != nil {
		return false, fmt.Errorf("get namespace type of %s: %w", p, err)
	}
	if typ != unix.CLONE_NEWNET {
		return false, errdefs.Errorf(errdefs.CodeConflict, "%s is a mounted namespace of type %#x, not a network namespace", p, typ)
	}
	return true, nil
}

// newNamed creates a network namespace on a dedicated OS thread and binds
// it to p. The thread is put back into its original namespace; if that
// fails the thread stays locked, so the Go runtime ends it with the
// goroutine instead of reusing a thread that sits in the wrong namespace.
func newNamed(p string) error {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDONLY, 0o444)
	if err != nil {
		return fmt.Errorf("create netns file %s: %w", p, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close netns file %s: %w", p, err)
	}
	err = onThreadIn(
		func() error {
			if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
				return fmt.Errorf("unshare netns: %w", err)
			}
			return nil
		},
		func() error {
			if err := unix.Mount("/proc/thread-self/ns/net", p, "none", unix.MS_BIND, ""); err != nil {
				return fmt.Errorf("bind netns to %s: %w", p, err)
			}
			return nil
		})
	if err != nil {
		if rmErr := os.Remove(p); rmErr != nil && !errors.Is(rmErr, fs.ErrNotExist) {
			err = errors.Join(err, fmt.Errorf("remove netns file %s: %w", p, rmErr))
		}
		return err
	}
	return nil
}

// onThreadIn runs enter and then fn on a fresh goroutine locked to its OS
// thread, and moves the thread back to the original netns afterwards.
// enter switches the thread's netns (unshare or setns); nothing else in
// the process ever runs in that namespace.
func onThreadIn(enter, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("get current netns: %w", err)
			return
		}
		defer orig.Close()
		if err := enter(); err != nil {
			// enter may have switched before failing; restore in any case.
			if rerr := netns.Set(orig); rerr != nil {
				done <- errors.Join(err, fmt.Errorf("restore netns: %w", rerr))
				return // thread stays locked and dies with the goroutine
			}
			runtime.UnlockOSThread()
			done <- err
			return
		}
		ferr := fn()
		if rerr := netns.Set(orig); rerr != nil {
			done <- errors.Join(ferr, fmt.Errorf("restore netns: %w", rerr))
			return // thread stays locked and dies with the goroutine
		}
		runtime.UnlockOSThread()
		done <- ferr
	}()
	return <-done
}

// runIn runs fn on a thread inside the namespace at path. Sockets made by
// fn belong to that namespace for their whole life.
func runIn(path string, fn func() error) error {
	return onThreadIn(func() error {
		h, err := netns.GetFromPath(path)
		if err != nil {
			return fmt.Errorf("open netns %s: %w", path, err)
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			return fmt.Errorf("enter netns %s: %w", path, err)
		}
		return nil
	}, fn)
}

// handle opens a route-netlink handle inside the namespace at path; no
// package-global netlink handle is ever used.
func handle(path string) (*netlink.Handle, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", path, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("open netlink in netns %s: %w", path, err)
	}
	return h, nil
}

func loUp(path string) error {
	h, err := handle(path)
	if err != nil {
		return err
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo in netns %s: %w", path, err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("set lo up in netns %s: %w", path, err)
	}
	return nil
}

// maxUnmounts bounds the unmount loop: a name mounted more than this many
// times over itself is not something ctld made.
const maxUnmounts = 16

// Delete removes the named namespace. It is idempotent: a missing file or
// an unmounted one is success. The bind mount is detached lazily, as
// iproute2 does: that removes the name; the namespace itself ends when the
// last process or fd in it goes, which the cleanup proof checks
// separately (runsc gone).
func (n *Netns) Delete(ctx context.Context, name string) error {
	if err := validateName(name); err != nil {
		return err
	}
	p := n.Path(name)
	unmounted := 0
	for ; ; unmounted++ {
		err := unix.Unmount(p, unix.MNT_DETACH)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			break // not (or no longer) mounted
		}
		if err != nil {
			return fmt.Errorf("unmount netns %s: %w", p, err)
		}
		if unmounted == maxUnmounts {
			return fmt.Errorf("unmount netns %s: still mounted after %d unmounts", p, maxUnmounts)
		}
	}
	err := os.Remove(p)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove netns file %s: %w", p, err)
	}
	if unmounted > 0 || err == nil {
		n.logger().Info("netns deleted", "netns", name, "path", p, "unmounts", unmounted)
	}
	return nil
}

// List returns the names (prefix stripped) of the namespaces in Dir,
// sorted. Files with the prefix whose rest is not a valid name are logged
// and skipped: ctld never made them.
func (n *Netns) List(ctx context.Context) ([]string, error) {
	ents, err := os.ReadDir(n.dir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list netns dir: %w", err)
	}
	var out []string
	for _, e := range ents {
		name, ok := strings.CutPrefix(e.Name(), n.prefix())
		if !ok {
			continue
		}
		if validateName(name) != nil {
			n.logger().Warn("ignoring foreign netns file", "file", e.Name(), "dir", n.dir())
			continue
		}
		out = append(out, name)
	}
	slices.Sort(out)
	return out, nil
}

// Mounted returns the names (prefix stripped) whose namespace file in Dir
// is mounted, sorted, from one read of the mount table: the reconciler's
// inventory, which must not parse mountinfo once per sandbox.
func (n *Netns) Mounted(ctx context.Context) ([]string, error) {
	mp := n.MountinfoPath
	if mp == "" {
		mp = mountinfo.SelfPath
	}
	ms, err := mountinfo.ReadFile(mp)
	if err != nil {
		return nil, err
	}
	// mountinfo shows resolved paths (/var/run/netns is /run/netns).
	dir := n.dir()
	if d, err := filepath.EvalSymlinks(dir); err == nil {
		dir = d
	}
	var out []string
	for _, m := range ms {
		name, ok := strings.CutPrefix(filepath.Base(m.MountPoint), n.prefix())
		if ok && m.FSType == "nsfs" && filepath.Dir(m.MountPoint) == dir && validateName(name) == nil && !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out, nil
}

// CheckGone is the netns part of the cleanup proof: the file is absent,
// nothing is mounted at its path, and the namespace itself (id, from
// Identify; zero when unknown) is gone: no thread in it, no fd to it, no
// nsfs mount of it in any mount namespace. Removing the name alone does
// not end a namespace that a process still holds.
func (n *Netns) CheckGone(ctx context.Context, name string, id NSID) (ok bool, detail string) {
	if err := validateName(name); err != nil {
		return false, err.Error()
	}
	p := n.Path(name)
	mp := n.MountinfoPath
	if mp == "" {
		mp = mountinfo.SelfPath
	}
	ms, err := mountinfo.ReadFile(mp)
	if err != nil {
		return false, fmt.Sprintf("cannot read mounts: %v", err)
	}
	// mountinfo shows resolved paths (/var/run/netns is /run/netns).
	resolved := p
	if d, err := filepath.EvalSymlinks(n.dir()); err == nil {
		resolved = filepath.Join(d, n.prefix()+name)
	}
	if at := mountinfo.At(ms, resolved); len(at) > 0 {
		return false, fmt.Sprintf("%s still mounted (%s %s)", resolved, at[0].FSType, at[0].Root)
	}
	if _, err := os.Lstat(p); err == nil {
		return false, fmt.Sprintf("not mounted but %s still exists", p)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Sprintf("cannot stat %s: %v", p, err)
	}
	ok, d := n.checkNamespaceGone(id)
	if !ok {
		return false, d
	}
	return true, fmt.Sprintf("%s absent and not mounted; %s", p, d)
}

// Describe lists the links ("lo up") and routes of every table
// ("local 127.0.0.0/8 dev lo") inside the namespace, for tests and doctor.
func (n *Netns) Describe(ctx context.Context, name string) (links []string, routes []string, err error) {
	if err := validateName(name); err != nil {
		return nil, nil, err
	}
	h, err := handle(n.Path(name))
	if err != nil {
		return nil, nil, err
	}
	defer h.Close()
	ls, err := retryDump(h.LinkList)
	if err != nil {
		return nil, nil, fmt.Errorf("list links in netns %s: %w", name, err)
	}
	names := map[int]string{}
	for _, l := range ls {
		a := l.Attrs()
		names[a.Index] = a.Name
		state := "down"
		if a.Flags&net.FlagUp != 0 {
			state = "up"
		}
		links = append(links, a.Name+" "+state)
	}
	rs, err := retryDump(func() ([]netlink.Route, error) {
		return h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		return nil, nil, fmt.Errorf("list routes in netns %s: %w", name, err)
	}
	for _, r := range rs {
		routes = append(routes, formatRoute(r, names))
	}
	slices.Sort(links)
	slices.Sort(routes)
	return links, routes, nil
}

// formatRoute renders a route as "<table> <dst> dev <link>[ via <gw>]".
func formatRoute(r netlink.Route, links map[int]string) string {
	table := fmt.Sprint(r.Table)
	switch r.Table {
	case unix.RT_TABLE_MAIN:
		table = "main"
	case unix.RT_TABLE_LOCAL:
		table = "local"
	}
	dst := "default"
	if r.Dst != nil {
		dst = r.Dst.String()
	}
	dev := links[r.LinkIndex]
	if dev == "" {
		dev = fmt.Sprintf("if%d", r.LinkIndex)
	}
	s := fmt.Sprintf("%s %s dev %s", table, dst, dev)
	if r.Gw != nil {
		s += " via " + r.Gw.String()
	}
	return s
}
