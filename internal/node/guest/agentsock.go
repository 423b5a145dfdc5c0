package guest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// A generation's agent socket directory is bound read-write into its
// guest (runsc.AgentSocketDir): guest root can create, remove and replace
// anything in it. So (issue 21):
//   - it is a tmpfs of its own, small in bytes and inodes (AgentDirs), so
//     a guest filling it hits ENOSPC there, not in the host's /run;
//   - the socket is opened O_PATH|O_NOFOLLOW and must be a socket
//     (DialInDir): a guest-placed symlink to another host socket is
//     refused, never dialled as root;
//   - the peer must be inside the generation (AgentPeers): its SO_PEERCRED
//     pid is in the generation's lease cgroup, where runsc starts the
//     sandbox and the gofer (--ignore-cgroups: ctld starts them there).
//     A socket the guest made itself is served by the sentry or gofer of
//     that same generation, so it passes, and only reaches that guest.

// AgentDirs makes each generation's agent socket directory a small file
// system of its own. PlainDirs (the fake kernel): a plain directory.
type AgentDirs interface {
	// Mount mounts it on dir (made by the caller); already mounted is
	// success.
	Mount(dir string) error
	// Unmount unmounts dir; not mounted or absent is success.
	Unmount(dir string) error
}

// AgentPeers checks that the process at the other end of an agent
// connection is the generation's. AnyPeer (the fake kernel, whose agents
// run in the test process): no check.
type AgentPeers interface {
	// CheckPeer returns nil if pid runs in the cgroup cgroupsPath (as
	// /proc/<pid>/cgroup names it) or below it.
	CheckPeer(pid int32, cgroupsPath string) error
}

// PlainDirs leaves agent socket dirs plain directories (no file system
// of their own): the fake kernel's.
type PlainDirs struct{}

// Mount implements AgentDirs: nothing to mount.
func (PlainDirs) Mount(string) error { return nil }

// Unmount implements AgentDirs: nothing to unmount.
func (PlainDirs) Unmount(string) error { return nil }

// AnyPeer accepts every agent peer: the fake kernel's, whose agents run in
// the test process.
type AnyPeer struct{}

// CheckPeer implements AgentPeers: no check.
func (AnyPeer) CheckPeer(int32, string) error { return nil }

// Defaults of TmpfsAgentDirs: the directory holds the nonce (at most 256
// bytes, removed by the agent) and the socket; a page or two of data and
// a handful of inodes is all it needs.
const (
	DefaultAgentDirBytes  = 64 << 10
	DefaultAgentDirInodes = 16
)

// TmpfsAgentDirs mounts a tmpfs with size= and nr_inodes= on each agent
// socket directory.
type TmpfsAgentDirs struct {
	Bytes  int64 // size=; 0: DefaultAgentDirBytes
	Inodes int   // nr_inodes=; 0: DefaultAgentDirInodes
}

// Options is the tmpfs's mount data.
func (t TmpfsAgentDirs) Options() string {
	b, i := t.Bytes, t.Inodes
	if b <= 0 {
		b = DefaultAgentDirBytes
	}
	if i <= 0 {
		i = DefaultAgentDirInodes
	}
	return fmt.Sprintf("size=%d,nr_inodes=%d,mode=0700", b, i)
}

// Mount implements AgentDirs.
func (t TmpfsAgentDirs) Mount(dir string) error {
	if mounted, err := IsMountPoint(dir); err != nil {
		return fmt.Errorf("mount agent dir: %w", err)
	} else if mounted {
		return nil
	}
	if err := unix.Mount("ctld-agent", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, t.Options()); err != nil {
		return fmt.Errorf("mount agent dir tmpfs on %s (%s): %w", dir, t.Options(), err)
	}
	return nil
}

// Unmount implements AgentDirs. A busy mount (a gofer that has not
// exited yet) is retried a few times.
func (TmpfsAgentDirs) Unmount(dir string) error {
	for i := 0; ; i++ {
		err := unix.Unmount(dir, unix.UMOUNT_NOFOLLOW)
		switch {
		case err == nil:
			continue // a mount stacked by an earlier attempt: unmount all
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil // not mounted, or gone
		case errors.Is(err, unix.EBUSY) && i < 20:
			time.Sleep(50 * time.Millisecond)
		default:
			return fmt.Errorf("unmount agent dir %s: %w", dir, err)
		}
	}
}

// IsMountPoint reports whether dir is the root of a mount (its mount id
// differs from its parent's).
func IsMountPoint(dir string) (bool, error) {
	id := func(p string) (uint64, error) {
		var st unix.Statx_t
		if err := unix.Statx(unix.AT_FDCWD, p, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID, &st); err != nil {
			return 0, &os.PathError{Op: "statx", Path: p, Err: err}
		}
		return st.Mnt_id, nil
	}
	a, err := id(dir)
	if err != nil {
		return false, err
	}
	b, err := id(filepath.Dir(dir))
	if err != nil {
		return false, err
	}
	return a != b, nil
}

// ProcPeers checks a peer's cgroup in /proc/<pid>/cgroup.
type ProcPeers struct {
	Proc string // default /proc
}

// CheckPeer implements AgentPeers. A pid can be reused, but only after
// the peer exited, and the new holder must then be in the same lease
// cgroup, i.e. the same generation.
func (p ProcPeers) CheckPeer(pid int32, cgroupsPath string) error {
	if pid <= 0 {
		return fmt.Errorf("agent peer pid %d: not a process of this pid namespace", pid)
	}
	if cgroupsPath == "" || !strings.HasPrefix(cgroupsPath, "/") {
		return fmt.Errorf("agent peer %d: no lease cgroup to check against", pid)
	}
	proc := p.Proc
	if proc == "" {
		proc = "/proc"
	}
	f, err := os.Open(filepath.Join(proc, strconv.Itoa(int(pid)), "cgroup"))
	if err != nil {
		return fmt.Errorf("agent peer %d: read cgroup: %w", pid, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		cg, ok := strings.CutPrefix(sc.Text(), "0::")
		if !ok {
			continue
		}
		if cg == cgroupsPath || strings.HasPrefix(cg, cgroupsPath+"/") {
			return nil
		}
		return fmt.Errorf("agent peer %d runs in cgroup %q, not in the generation's %q", pid, cg, cgroupsPath)
	}
	return fmt.Errorf("agent peer %d: no cgroup v2 entry in /proc/%d/cgroup", pid, pid)
}

// ErrNotSocket: the agent's socket path is not a socket (a symlink, a
// file, a directory a guest put there).
var ErrNotSocket = errors.New("not a socket")

// DialInDir connects to the Unix socket name in dir, which the guest can
// write: the name is opened O_PATH|O_NOFOLLOW and must be a socket, and
// the connection goes through that descriptor, so what is dialled is the
// inode checked (a symlink placed there is refused, never followed). The
// path through /proc/self/fd also lifts the 107-byte limit of a socket
// path, which a generation's (run dir, a container id of up to 84 bytes)
// may pass.
func DialInDir(ctx context.Context, dir, name string) (net.Conn, error) {
	dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat(dfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: filepath.Join(dir, name), Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, &os.PathError{Op: "stat", Path: filepath.Join(dir, name), Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, fmt.Errorf("agent socket %s: mode %#o: %w", filepath.Join(dir, name), st.Mode&unix.S_IFMT, ErrNotSocket)
	}
	var d net.Dialer
	return d.DialContext(ctx, "unix", "/proc/self/fd/"+strconv.Itoa(fd))
}

// peerPID is the SO_PEERCRED pid of a Unix connection.
func peerPID(c net.Conn) (int32, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return 0, fmt.Errorf("agent connection: %T is not a Unix socket", c)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("agent peer: %w", err)
	}
	var cred *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, fmt.Errorf("agent peer: %w", err)
	}
	if serr != nil {
		return 0, fmt.Errorf("agent peer: getsockopt SO_PEERCRED: %w", serr)
	}
	return cred.Pid, nil
}
