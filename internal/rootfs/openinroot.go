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
// perm are those of os.OpenFile. It is how a user path from the file API
// reaches a guest's files, which the guest may have replaced by symlinks
// at any time.
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
