package dirstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/blockstore"
)

var (
	_ blockstore.RangeGetter = (*Store)(nil)
	_ blockstore.Packer      = (*Store)(nil)
)

// GetRange reads length bytes at off of the object key (a chunk in a
// pack): one pread, never more than length bytes.
func (s *Store) GetRange(ctx context.Context, key string, off int64, length int, buf []byte) ([]byte, error) {
	if err := blockstore.CheckKey(key); err != nil {
		return nil, err
	}
	if limit := blockstore.MaxObjectSize(key); off < 0 || length < 0 || off+int64(length) > limit {
		return nil, fmt.Errorf("get %s [%d, +%d): %w: at most %d bytes for this kind of object", key, off, length, blockstore.ErrTooLarge, limit)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	fd, p, err := s.openObject(key)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	if cap(buf) < length {
		buf = make([]byte, length)
	}
	buf = buf[:length]
	for n := 0; n < length; {
		m, err := unix.Pread(fd, buf[n:], off+int64(n))
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EISDIR:
			return nil, fmt.Errorf("get %s: %w", key, blockstore.ErrNotFound)
		case err != nil:
			return nil, fmt.Errorf("get %s: %w", key, &fs.PathError{Op: "pread", Path: p, Err: err})
		case m == 0:
			return nil, fmt.Errorf("get %s [%d, +%d): %w", key, off, length, io.ErrUnexpectedEOF)
		}
		n += m
	}
	return buf, nil
}

// NewPack starts the object key as a hidden temp file beside its name,
// written by appends: its writeback starts as it grows (so the commit's
// fsync waits for little), and Commit makes it durable, links it to its
// name and syncs the directory, as Put does, for the whole pack at once.
func (s *Store) NewPack(ctx context.Context, key string) (blockstore.PackWriter, error) {
	if err := blockstore.CheckKey(key); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("new pack %s: %w", key, err)
	}
	p := s.path(key)
	dir := filepath.Dir(p)
	if err := mkdirs(s.ops, dir, true); err != nil {
		return nil, fmt.Errorf("new pack %s: %w", key, err)
	}
	f, err := s.ops.createTemp(dir, filepath.Base(p))
	if err != nil {
		return nil, fmt.Errorf("new pack %s: %w", key, err)
	}
	return &pack{s: s, key: key, path: p, f: f}, nil
}

// kickBytes is how much a pack grows between writeback starts.
const kickBytes = 4 << 20

type pack struct {
	s         *Store
	key, path string
	f         *os.File
	size      int64
	kicked    int64 // writeback started up to here
	err       error
}

func (p *pack) Write(b []byte) (int, error) {
	if p.err != nil {
		return 0, p.err
	}
	if p.size+int64(len(b)) > blockstore.MaxPackObject {
		p.err = fmt.Errorf("pack %s: over %d bytes", p.key, blockstore.MaxPackObject)
		return 0, p.err
	}
	n, err := p.f.Write(b)
	p.size += int64(n)
	if err != nil {
		p.err = fmt.Errorf("pack %s: %w", p.key, err)
		return n, p.err
	}
	if p.size-p.kicked >= kickBytes {
		// Only a hint (SYNC_FILE_RANGE_WRITE does not wait, nor make
		// anything durable): Commit's fsync is what counts.
		_ = unix.SyncFileRange(int(p.f.Fd()), p.kicked, p.size-p.kicked, unix.SYNC_FILE_RANGE_WRITE)
		p.kicked = p.size
	}
	return n, nil
}

// Commit: data durable, then the name, then the name durable.
func (p *pack) Commit(ctx context.Context) error {
	tmp := p.f.Name()
	defer p.s.ops.remove(tmp) // on success the name is the second link
	err := p.f.Close()
	if p.err != nil {
		return p.err
	}
	if err != nil {
		return fmt.Errorf("commit pack %s: %w", p.key, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("commit pack %s: %w", p.key, err)
	}
	if err := p.s.ops.syncFile(tmp); err != nil {
		return fmt.Errorf("commit pack %s: %w", p.key, err)
	}
	if err := p.s.ops.link(tmp, p.path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("commit pack %s: %w", p.key, blockstore.ErrExists)
		}
		return fmt.Errorf("commit pack %s: %w", p.key, err)
	}
	if err := p.s.ops.syncDir(filepath.Dir(p.path)); err != nil {
		return fmt.Errorf("commit pack %s: %w", p.key, err)
	}
	return nil
}

func (p *pack) Abort() {
	_ = p.f.Close()
	_ = p.s.ops.remove(p.f.Name())
}
