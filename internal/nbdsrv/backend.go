// Package nbdsrv is an NBD server (fixed newstyle handshake, simple or
// structured replies, block status where the Backend lists extents)
// over a Backend: requests are served concurrently with a bounded number and
// size in flight, FLUSH and FUA reach Backend.Sync, TRIM and WRITE_ZEROES
// leave ranges that read as zeros. It builds on go-nbd's protocol constants;
// go-nbd's own server serves one request at a time and advertises neither
// FLUSH nor TRIM/WRITE_ZEROES.
package nbdsrv

import (
	"errors"
	"io"

	"golang.org/x/sys/unix"
)

// Backend is the device an export serves. Methods are called concurrently,
// never with a range beyond Size.
type Backend interface {
	io.ReaderAt
	io.WriterAt
	// Size is the device size in bytes; it does not change while served.
	Size() (int64, error)
	// Sync makes durable every WriteAt, Trim and WriteZeroes that returned
	// before it was called (FLUSH, FUA).
	Sync() error
	// Trim discards a range: afterwards it reads as zeros (never as older
	// data, e.g. a base image under a copy-on-write device).
	Trim(off, length int64) error
	// WriteZeroes makes a range read as zeros; noHole asks that it stay
	// allocated (NBD_CMD_FLAG_NO_HOLE) where the backend can tell.
	WriteZeroes(off, length int64, noHole bool) error
}

// FileSegment is a run of a read's bytes in a file: Len bytes at Off of
// the open file descriptor Fd.
type FileSegment struct {
	Fd  int
	Off int64
	Len int
}

// FileReader is an optional Backend extension: a read whose bytes all lie
// in files the backend holds open is answered with sendfile(2) from
// them, one copy (page cache to socket) instead of a read into a buffer
// and a write from it. The server uses it only on a socket it can get
// the descriptor of.
type FileReader interface {
	// ReadFiles appends the segments of [off, off+n), in order, to segs;
	// ok false says some part is not in a file (the server then calls
	// ReadAt). The files must stay open, and their bytes in those ranges
	// unchanged, while the backend is served.
	ReadFiles(segs []FileSegment, off int64, n int) (_ []FileSegment, ok bool)
}

// Extent is a run of a device's bytes of one allocation status.
type Extent struct {
	Length int64
	// Hole: not allocated in the backend; Zero: reads as zeros.
	Hole, Zero bool
}

// ExtentLister is an optional Backend extension: with it the server offers
// the base:allocation metadata context (NBD_CMD_BLOCK_STATUS), so a client
// such as nbdcopy or qemu-img skips ranges that read as zeros instead of
// reading them.
type ExtentLister interface {
	// Extents describes [off, off+length) from off on as consecutive
	// extents: at least one, their lengths summing to at most length (the
	// client asks again for the rest).
	Extents(off, length int64) ([]Extent, error)
}

// errnoOf maps a backend error to the NBD error sent to the client.
func errnoOf(err error) uint32 {
	var e unix.Errno
	if errors.As(err, &e) {
		switch e {
		case unix.EPERM, unix.EROFS, unix.EACCES:
			return errPerm
		case unix.ENOSPC, unix.EDQUOT:
			return errNoSpc
		case unix.EINVAL:
			return errInval
		case unix.ENOMEM:
			return errNoMem
		case unix.EOPNOTSUPP:
			return errNotSup
		}
	}
	return errIO
}
