package ha

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/ctld/ctld/internal/logging"
)

// Status is what an instance reports on its probe socket.
type Status struct {
	Slot   string    `json:"slot"`
	Role   Role      `json:"role"`
	Epoch  uint64    `json:"epoch"`
	Health string    `json:"health"`
	PID    int       `json:"pid"`
	Since  time.Time `json:"since"`
}

// ErrSocketInUse means a live server already answers on the socket path.
var ErrSocketInUse = errors.New("socket in use by a live server")

// ListenUnix listens on a Unix stream socket at path with the given mode and
// group (gid -1 keeps the process's group). It refuses to take over a socket
// that a live server still answers on, replaces a stale one, and never
// removes anything that is not a socket.
//
// The socket is bound under a temporary name, given its mode and group, and
// then renamed into place, so it never appears at path with wider access
// than asked for. Closing the listener does not unlink path: by then it may
// be a successor's socket; the next ListenUnix replaces a stale one.
func ListenUnix(path string, mode os.FileMode, gid int) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("create socket dir: %w", err)
	}
	if err := checkStale(path); err != nil {
		return nil, err
	}
	tmp := filepath.Join(filepath.Dir(path), "."+strconv.Itoa(os.Getpid())+"."+filepath.Base(path))
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("remove leftover temp socket %s: %w", tmp, err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", tmp, err)
	}
	ln.SetUnlinkOnClose(false)
	fail := func(err error) (net.Listener, error) {
		return nil, errors.Join(err, ln.Close(), os.Remove(tmp))
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return fail(fmt.Errorf("chmod socket %s: %w", tmp, err))
	}
	if gid >= 0 {
		if err := os.Lchown(tmp, -1, gid); err != nil {
			return fail(fmt.Errorf("chown socket %s to gid %d: %w", tmp, gid, err))
		}
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail(fmt.Errorf("rename socket %s to %s: %w", tmp, path, err))
	}
	return ln, nil
}

// checkStale returns nil if path is free or holds a socket nobody answers on.
func checkStale(path string) error {
	st, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("stat socket %s: %w", path, err)
	}
	if st.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("refuse to replace %s: not a socket (mode %v)", path, st.Mode())
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		_ = c.Close()
		return fmt.Errorf("listen on %s: %w", path, ErrSocketInUse)
	}
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	// EAGAIN (full backlog) or a timeout mean someone is there.
	return fmt.Errorf("probe existing socket %s: %w", path, err)
}

// ServeProbe answers each connection on ln with one JSON Status line and
// closes it. It returns nil when ctx ends (closing ln), or the accept error.
func ServeProbe(ctx context.Context, ln net.Listener, status func() Status, logger *slog.Logger) error {
	logger = logging.OrDiscard(logger)
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("accept probe connection: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			// A client that does not read must not pin a goroutine.
			_ = c.SetWriteDeadline(time.Now().Add(time.Second))
			if err := json.NewEncoder(c).Encode(status()); err != nil {
				logger.Debug("write probe status", "err", err)
			}
		}()
	}
}

// Probe asks the instance serving path for its status.
func Probe(ctx context.Context, path string) (Status, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return Status{}, fmt.Errorf("dial probe %s: %w", path, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetReadDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetReadDeadline(time.Now()) })
	defer stop()
	var s Status
	if err := json.NewDecoder(c).Decode(&s); err != nil {
		return Status{}, fmt.Errorf("read probe %s: %w", path, err)
	}
	return s, nil
}
