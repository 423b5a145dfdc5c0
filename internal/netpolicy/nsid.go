package netpolicy

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/holders"
	"github.com/ctld/ctld/internal/mountinfo"
)

// NSID identifies one network namespace, not its name: the nsfs device
// and inode (what /proc/PID/ns/net and a bind mount of it stat to) and the
// kernel's netns cookie, which is never reused while inode numbers are.
type NSID struct {
	Dev    uint64 `json:"dev"`
	Ino    uint64 `json:"ino"`
	Cookie uint64 `json:"cookie,omitempty"`
}

// Known reports whether id was recorded.
func (id NSID) Known() bool { return id.Ino != 0 }

func (id NSID) String() string { return fmt.Sprintf("net:[%d]", id.Ino) }

func (n *Netns) proc() string {
	if n.ProcRoot == "" {
		return mountinfo.ProcRoot
	}
	return n.ProcRoot
}

// Identify returns the identity of the named namespace, recorded at
// creation so the cleanup proof can look for the namespace itself.
func (n *Netns) Identify(ctx context.Context, name string) (NSID, error) {
	if err := validateName(name); err != nil {
		return NSID{}, err
	}
	p := n.Path(name)
	if is, err := isNetnsFile(p); err != nil || !is {
		return NSID{}, fmt.Errorf("identify netns %s: not a mounted network namespace (%v)", p, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return NSID{}, fmt.Errorf("identify netns %s: %w", p, err)
	}
	c, err := cookie(p)
	if err != nil {
		return NSID{}, err
	}
	return NSID{Dev: st.Dev, Ino: st.Ino, Cookie: c}, nil
}

// cookie reads the netns cookie of the namespace at path (any path that
// opens it: a bind mount, /proc/PID/ns/net, /proc/PID/fd/N) from a socket
// made inside it.
func cookie(path string) (uint64, error) {
	var c uint64
	err := runIn(path, func() error {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("socket in netns %s: %w", path, err)
		}
		defer unix.Close(fd)
		v, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
		if err != nil {
			return fmt.Errorf("read netns cookie of %s: %w", path, err)
		}
		c = v
		return nil
	})
	return c, err
}

// checkNamespaceGone looks for the namespace id anywhere: a thread in it,
// an open fd to it, or an nsfs mount of it in any mount namespace. A
// candidate with the same inode but another cookie is a new namespace that
// got the freed inode number, not ours.
func (n *Netns) checkNamespaceGone(id NSID) (ok bool, detail string) {
	if !id.Known() {
		return true, "namespace identity not recorded: holders not checked"
	}
	type cand struct{ what, path string }
	var cands []cand
	refs, err := holders.Namespace(n.proc(), "net", id.Dev, id.Ino)
	if err != nil {
		return false, fmt.Sprintf("cannot look for holders of %s: %v", id, err)
	}
	for _, r := range refs {
		cands = append(cands, cand{r.String(), r.Path})
	}
	nss, err := mountinfo.AllNamespaces(n.proc())
	if err != nil {
		return false, fmt.Sprintf("cannot read the mounts of every namespace: %v", err)
	}
	for _, ns := range nss {
		for _, m := range ns.Mounts {
			if m.FSType == "nsfs" && m.Root == id.String() {
				// Opened through that process's root, which sees its
				// namespace's mounts.
				p := filepath.Join(n.proc(), fmt.Sprint(ns.PID), "root", m.MountPoint)
				cands = append(cands, cand{fmt.Sprintf("mounted at %s in mount namespace %s (pid %d)", m.MountPoint, ns.ID, ns.PID), p})
			}
		}
	}
	var held []string
	for _, c := range cands {
		if id.Cookie != 0 {
			got, err := cookie(c.path)
			if err != nil && (errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH)) {
				continue // the holder went away meanwhile
			}
			if err == nil && got != id.Cookie {
				continue // a newer namespace with the reused inode number
			}
		}
		held = append(held, c.what)
	}
	if len(held) > 0 {
		if len(held) > 4 {
			held = append(held[:4], fmt.Sprintf("and %d more", len(held)-4))
		}
		return false, fmt.Sprintf("namespace %s still alive: %s", id, strings.Join(held, ", "))
	}
	return true, fmt.Sprintf("namespace %s: no thread in it, no fd to it, mounted in none of %d mount namespaces", id, len(nss))
}
