package guestlog

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
)

// Follower reads what is appended to a log after a point, across the
// rotations of a Ring (the current half renamed to .1) and the truncations
// of Cap. It holds at most one open file; Close it.
type Follower struct {
	path string
	f    *os.File
	ino  uint64
	off  int64
}

// Follow returns the log's content now (old half, then current) and a
// Follower positioned right after it, so nothing is read twice or missed
// between the two.
func Follow(dir, name string) ([]byte, *Follower, error) {
	fl := &Follower{path: filepath.Join(dir, name)}
	old, err := os.ReadFile(fl.path + OldSuffix)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("read log: %w", err)
	}
	if err := fl.reopen(); err != nil {
		return nil, nil, err
	}
	cur, err := fl.Next(1 << 30)
	if err != nil {
		fl.Close()
		return nil, nil, err
	}
	return append(old, cur...), fl, nil
}

// reopen opens the current file (if any) from its start.
func (fl *Follower) reopen() error {
	if fl.f != nil {
		fl.f.Close()
		fl.f = nil
	}
	f, err := os.Open(fl.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil // not written yet
	}
	if err != nil {
		return fmt.Errorf("open log: %w", err)
	}
	ino, err := inode(f)
	if err != nil {
		f.Close()
		return err
	}
	fl.f, fl.ino, fl.off = f, ino, 0
	return nil
}

func inode(f *os.File) (uint64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("stat log: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, errors.New("stat log: no inode")
	}
	return st.Ino, nil
}

// Next returns up to limit bytes appended since the last call, or nothing
// when nothing new is there. It never blocks.
func (fl *Follower) Next(limit int64) ([]byte, error) {
	var out []byte
	for int64(len(out)) < limit {
		if fl.f == nil {
			if err := fl.reopen(); err != nil || fl.f == nil {
				return out, err
			}
		}
		fi, err := fl.f.Stat()
		if err != nil {
			return out, fmt.Errorf("stat log: %w", err)
		}
		if fi.Size() < fl.off {
			fl.off = 0 // truncated by Cap: start over
		}
		if fi.Size() > fl.off {
			n := min(fi.Size()-fl.off, limit-int64(len(out)))
			b := make([]byte, n)
			r, err := fl.f.ReadAt(b, fl.off)
			if err != nil && !errors.Is(err, io.EOF) {
				return out, fmt.Errorf("read log: %w", err)
			}
			fl.off += int64(r)
			out = append(out, b[:r]...)
			continue
		}
		// At the end of the file we hold: was it rotated away? The old
		// file is drained by now (we hold it open), so move on.
		st, err := os.Stat(fl.path)
		if errors.Is(err, os.ErrNotExist) {
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("stat log: %w", err)
		}
		if sys, ok := st.Sys().(*syscall.Stat_t); ok && sys.Ino == fl.ino {
			return out, nil
		}
		if err := fl.reopen(); err != nil || fl.f == nil {
			return out, err
		}
	}
	return out, nil
}

// Close releases the file held.
func (fl *Follower) Close() error {
	if fl.f == nil {
		return nil
	}
	err := fl.f.Close()
	fl.f = nil
	return err
}
