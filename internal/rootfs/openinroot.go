package rootfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ErrParentMissing is returned (wrapped, and matching fs.ErrNotExist) when
// a file is to be created in a directory that does not exist: file put
// never creates directories.
var ErrParentMissing = errors.New("parent directory does not exist")

// openat2 returns EAGAIN when a rename elsewhere in the tree raced the
// lookup; a few retries are enough for it to settle.
const openRetries = 16

// OpenInRoot opens path as if root were "/": "..", absolute paths and
// symlinks (absolute or relative) are all resolved inside root and can
// never leave it, and magic links (/proc/self/fd/N) are refused. flag and
// perm are those of os.OpenFile. For a path a guest controls: it may
// have replaced any component by a symlink at any time. ctld itself no
// longer calls it: the files API reaches a guest's files through the
// guest agent (internal/node/agentcalls.go), as the workload's user. The
// host-side tests that look into a root (overlay_kernel_test.go) use it.
func OpenInRoot(root, path string, flag int, perm os.FileMode) (*os.File, error) {
	dfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open root %s: %w", root, &fs.PathError{Op: "open", Path: root, Err: err})
	}
	defer unix.Close(dfd)

	how := unix.OpenHow{
		Flags:   uint64(flag) | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	}
	if flag&(unix.O_CREAT|unix.O_TMPFILE) != 0 {
		// openat2 rejects a mode without O_CREAT/O_TMPFILE.
		how.Mode = uint64(syscallMode(perm))
	}
	fd, err := openat2Retry(dfd, path, &how)
	if err != nil {
		if errors.Is(err, unix.ENOENT) && flag&unix.O_CREAT != 0 && !parentExists(dfd, path) {
			return nil, fmt.Errorf("open %s in root %s: %w", path, root, &fs.PathError{Op: "create", Path: path, Err: parentMissing{}})
		}
		return nil, fmt.Errorf("open %s in root %s: %w", path, root, &fs.PathError{Op: "openat2", Path: path, Err: err})
	}
	return os.NewFile(uintptr(fd), filepath.Join(root, filepath.Clean("/"+path))), nil
}

// parentMissing matches both ErrParentMissing and fs.ErrNotExist.
type parentMissing struct{}

func (parentMissing) Error() string { return ErrParentMissing.Error() }
func (parentMissing) Is(target error) bool {
	return target == ErrParentMissing || target == fs.ErrNotExist
}

func openat2Retry(dfd int, path string, how *unix.OpenHow) (int, error) {
	for i := 0; ; i++ {
		fd, err := unix.Openat2(dfd, path, how)
		if err == nil || !errors.Is(err, unix.EAGAIN) || i == openRetries {
			return fd, err
		}
	}
}

// parentExists reports whether the directory that would hold path exists
// inside root, resolved the same confined way.
func parentExists(dfd int, path string) bool {
	how := unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	}
	fd, err := openat2Retry(dfd, filepath.Dir(filepath.Clean("/"+path)), &how)
	if err != nil {
		return false
	}
	unix.Close(fd)
	return true
}

// syscallMode converts permission and special bits as os.OpenFile does.
func syscallMode(m os.FileMode) uint32 {
	o := uint32(m.Perm())
	if m&os.ModeSetuid != 0 {
		o |= unix.S_ISUID
	}
	if m&os.ModeSetgid != 0 {
		o |= unix.S_ISGID
	}
	if m&os.ModeSticky != 0 {
		o |= unix.S_ISVTX
	}
	return o
}

// ErrNotRegular is returned (wrapped) by OpenRegularInRoot for anything
// but a regular file: directory, FIFO, socket, device node.
var ErrNotRegular = errors.New("not a regular file")

// notRegular names the kind of file found, and matches ErrNotRegular.
type notRegular struct{ kind string }

func (e notRegular) Error() string        { return ErrNotRegular.Error() + " (" + e.kind + ")" }
func (e notRegular) Is(target error) bool { return target == ErrNotRegular }

// OpenRegularInRoot opens path inside root as OpenInRoot does, but only if
// it is a regular file, and without ever opening anything else: the path
// is first opened O_PATH (which runs no driver and waits for no FIFO
// writer), checked with fstat, and only then reopened through
// /proc/self/fd with flag, which names the same inode whatever the guest
// does to the path meanwhile. A FIFO, socket or device node that a guest
// (or a template) put at the path is refused with ErrNotRegular instead of
// hanging the caller or touching a host device. With O_CREATE a missing
// file is created O_EXCL, so what is created is a new regular file.
func OpenRegularInRoot(root, path string, flag int, perm os.FileMode) (*os.File, error) {
	const tries = 3 // a guest creating or removing the same path races us
	var err error
	for range tries {
		var p *os.File
		p, err = OpenInRoot(root, path, unix.O_PATH, 0)
		if errors.Is(err, fs.ErrNotExist) && flag&os.O_CREATE != 0 {
			var f *os.File
			f, err = OpenInRoot(root, path, flag|os.O_EXCL|unix.O_NONBLOCK|unix.O_NOCTTY, perm)
			if errors.Is(err, fs.ErrExist) {
				continue // made meanwhile: check what it is
			}
			return f, err
		}
		if err != nil {
			return nil, err
		}
		return reopenRegular(p, path, flag)
	}
	return nil, fmt.Errorf("open %s in root %s: %w", path, root, err)
}

// reopenRegular checks that the O_PATH file p is a regular file and opens
// it again with flag (O_CREATE and O_EXCL dropped: it exists). It closes p.
func reopenRegular(p *os.File, path string, flag int) (*os.File, error) {
	defer p.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(p.Fd()), &st); err != nil {
		return nil, fmt.Errorf("stat %s: %w", p.Name(), &fs.PathError{Op: "fstat", Path: path, Err: err})
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("open %s: %w", p.Name(), &fs.PathError{Op: "open", Path: path, Err: notRegular{fileKind(st.Mode)}})
	}
	flag = flag&^(os.O_CREATE|os.O_EXCL) | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC
	fd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", p.Fd()), flag, 0)
	if err != nil {
		return nil, fmt.Errorf("reopen %s: %w", p.Name(), &fs.PathError{Op: "open", Path: path, Err: err})
	}
	return os.NewFile(uintptr(fd), p.Name()), nil
}

func fileKind(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return "directory"
	case unix.S_IFIFO:
		return "FIFO"
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFCHR:
		return "character device"
	case unix.S_IFBLK:
		return "block device"
	case unix.S_IFLNK:
		return "symlink"
	}
	return fmt.Sprintf("file type %#o", mode&unix.S_IFMT)
}
