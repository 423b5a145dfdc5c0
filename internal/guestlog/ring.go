// Package guestlog keeps the log files of a sandbox generation bounded,
// readable and removable.
//
// A generation's logs live in one directory, <root>/<container>/:
//
//	init.log, init.log.1    the guest's init stdout+stderr (a Ring)
//	runsc.log, runsc.log.1  runsc's own log for the container (Cap)
//
// The guest decides how much its init writes, so that stream never reaches
// a file directly: it goes through a pipe to a small writer process (Run,
// started by Shim) that keeps the latest output in two halves of at most
// Max/2 bytes each. The writer runs in the generation's lease cgroup, in its
// own session: it outlives a ctld failover, and the tmpfs pages it writes
// are charged to the sandbox's memory lease. runsc opens its own log file
// itself (O_APPEND), so that one is bounded by copy-and-truncate instead.
package guestlog

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// File names inside a generation's log directory.
const (
	InitName  = "init.log"  // the guest's init stdout and stderr
	RunscName = "runsc.log" // runsc's --log for the container
	// PanicName is runsc's --panic-log for the container: where the
	// sandbox (sentry) and gofer write a Go panic or fatal error (their
	// stderr is /dev/null, and --log gets only runsc's own messages).
	PanicName = "panic.log"
	// OldSuffix names the previous half of a log.
	OldSuffix = ".1"
)

// MinMax is the smallest cap accepted: two halves of a page each.
const MinMax = 8 << 10

// ValidMax checks a cap in bytes.
func ValidMax(max int64) error {
	if max < MinMax {
		return fmt.Errorf("log cap %d bytes is below the minimum %d", max, MinMax)
	}
	return nil
}

// Ring writes a stream into Dir/Name and Dir/Name.1, each at most Max/2
// bytes: when Name would pass Max/2 it becomes Name.1 (replacing the older
// half) and a new Name starts. Together they hold the latest output and
// never more than Max bytes.
//
// Write never fails: a write error (the directory removed, the filesystem
// full) drops that output and is reported in the file once writing works
// again, so the process feeding the ring keeps draining its pipe and the
// guest never blocks on a full log.
type Ring struct {
	Dir, Name string
	Max       int64

	f       *os.File
	size    int64
	dropped int64
	lastErr error
}

func (r *Ring) half() int64 { return max(r.Max/2, 1) }

func (r *Ring) path() string { return filepath.Join(r.Dir, r.Name) }

// open opens (or reopens) the current half for appending.
func (r *Ring) open() error {
	f, err := os.OpenFile(r.path(), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	r.f, r.size = f, fi.Size()
	return nil
}

// rotate makes the current half the old one and starts a new current.
func (r *Ring) rotate() error {
	if r.f != nil {
		r.f.Close()
		r.f = nil
	}
	if err := os.Rename(r.path(), r.path()+OldSuffix); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	f, err := os.OpenFile(r.path(), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	r.f, r.size = f, 0
	return nil
}

// Write appends p, rotating as needed. It always reports len(p) written.
func (r *Ring) Write(p []byte) (int, error) {
	n := len(p)
	if r.dropped > 0 {
		// Say what was lost before writing anything after it; if even
		// that fails, keep counting.
		note := []byte(fmt.Sprintf("\n[ctld: %d bytes of output dropped: %v]\n", r.dropped, r.lastErr))
		if r.write(note) {
			r.dropped, r.lastErr = 0, nil
		}
	}
	if !r.write(p) {
		r.dropped += int64(len(p))
	}
	return n, nil
}

// write appends p in pieces that fit the current half; false if any piece
// could not be written.
func (r *Ring) write(p []byte) bool {
	for len(p) > 0 {
		if r.f == nil {
			if err := r.open(); err != nil {
				r.lastErr = err
				return false
			}
		}
		if r.size >= r.half() {
			if err := r.rotate(); err != nil {
				r.lastErr = err
				return false
			}
		}
		c := p[:min(int64(len(p)), r.half()-r.size)]
		w, err := r.f.Write(c)
		r.size += int64(w)
		p = p[w:]
		if err != nil {
			r.lastErr = err
			r.f.Close()
			r.f = nil
			return false
		}
	}
	return true
}

// Close closes the current half.
func (r *Ring) Close() error {
	if r.f == nil {
		return nil
	}
	err := r.f.Close()
	r.f = nil
	return err
}

// Cap bounds a file that another process appends to with O_APPEND (runsc's
// --log): once it passes max bytes, its latest max/2 bytes become path.1
// and path is truncated, so the writer's next append starts it again. Lines
// appended between the copy and the truncate are lost; the file never
// holds more than max plus what is appended between two calls.
func Cap(path string, max int64) error {
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cap log: %w", err)
	}
	if fi.Size() <= max {
		return nil
	}
	tail, err := readTail(path, max/2)
	if err != nil {
		return fmt.Errorf("cap log: %w", err)
	}
	tmp := path + OldSuffix + ".tmp"
	if err := os.WriteFile(tmp, tail, 0o600); err != nil {
		return fmt.Errorf("cap log: %w", err)
	}
	if err := os.Rename(tmp, path+OldSuffix); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("cap log: %w", err)
	}
	if err := os.Truncate(path, 0); err != nil {
		return fmt.Errorf("cap log: %w", err)
	}
	return nil
}

// readTail returns the last n bytes of a file.
func readTail(path string, n int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	off := max(fi.Size()-n, 0)
	return io.ReadAll(io.NewSectionReader(f, off, fi.Size()-off))
}

// Tail returns the last n bytes of log name in dir: its old half, then its
// current one. A log that does not exist is empty.
func Tail(dir, name string, n int64) ([]byte, error) {
	var out []byte
	for _, p := range []string{filepath.Join(dir, name+OldSuffix), filepath.Join(dir, name)} {
		b, err := readTail(p, n)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read log: %w", err)
		}
		out = append(out, b...)
	}
	if int64(len(out)) > n {
		out = out[int64(len(out))-n:]
	}
	return out, nil
}

// LastLines returns the last n lines of b (n <= 0: all of b).
func LastLines(b []byte, n int) []byte {
	if n <= 0 {
		return b
	}
	end := len(b)
	if end > 0 && b[end-1] == '\n' {
		end--
	}
	for i := end - 1; i >= 0; i-- {
		if b[i] == '\n' {
			n--
			if n == 0 {
				return b[i+1:]
			}
		}
	}
	return b
}
