package nbdsrv

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// File is a Backend over a (sparse) regular file: TRIM and WRITE_ZEROES punch
// holes, FLUSH is fdatasync.
type File struct {
	f    *os.File
	size int64
}

var _ Backend = (*File)(nil)

// OpenFile opens an existing file as a backend of its current size.
func OpenFile(path string, readOnly bool) (*File, error) {
	flag := os.O_RDWR
	if readOnly {
		flag = os.O_RDONLY
	}
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return nil, fmt.Errorf("open nbd backend file: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("stat nbd backend file: %w", err)
	}
	if !st.Mode().IsRegular() {
		_ = f.Close()
		return nil, fmt.Errorf("open nbd backend file %s: not a regular file", path)
	}
	return &File{f: f, size: st.Size()}, nil
}

func (b *File) Size() (int64, error) { return b.size, nil }

func (b *File) ReadAt(p []byte, off int64) (int, error) {
	n, err := b.f.ReadAt(p, off)
	if errors.Is(err, io.EOF) && n == len(p) {
		err = nil
	}
	return n, err
}

func (b *File) WriteAt(p []byte, off int64) (int, error) { return b.f.WriteAt(p, off) }

func (b *File) Sync() error {
	if err := unix.Fdatasync(int(b.f.Fd())); err != nil {
		return fmt.Errorf("fdatasync %s: %w", b.f.Name(), err)
	}
	return nil
}

func (b *File) Trim(off, length int64) error {
	return b.fallocate(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, length)
}

func (b *File) WriteZeroes(off, length int64, noHole bool) error {
	if noHole {
		return b.fallocate(unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, off, length)
	}
	return b.fallocate(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, length)
}

// fallocate falls back to writing zeros where the filesystem cannot do it:
// the range must read as zeros either way.
func (b *File) fallocate(mode uint32, off, length int64) error {
	err := unix.Fallocate(int(b.f.Fd()), mode, off, length)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EOPNOTSUPP) {
		return fmt.Errorf("fallocate %s mode %#x [%d,+%d): %w", b.f.Name(), mode, off, length, err)
	}
	zero := make([]byte, min(length, 1<<20))
	for length > 0 {
		n := min(length, int64(len(zero)))
		if _, err := b.f.WriteAt(zero[:n], off); err != nil {
			return fmt.Errorf("write zeros to %s: %w", b.f.Name(), err)
		}
		off += n
		length -= n
	}
	return nil
}

// Close closes the file; it does not sync.
func (b *File) Close() error { return b.f.Close() }
