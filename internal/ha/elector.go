// Package ha elects the one primary of a node's ctld pair (DESIGN.md,
// invariant 1) and serves the per-instance probe socket.
//
// The primary is whoever holds an exclusive flock on <state>/ha/primary.lock.
// The kernel drops the lock when the holder's file description closes, so a
// crash or kill -9 hands over without any timeout. The lock file is never
// unlinked or renamed: a second inode at the same path would let two
// processes hold "the" lock at once. Taking the lock bumps a durable epoch
// that every journal record and proof carries.
package ha

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/fsutil"
	"github.com/ctld/ctld/internal/logging"
)

// Roles an instance reports on its probe socket. Only an instance that
// serves (journal taken over, reconciled, API listening) says primary; one
// that holds the lock but is not there yet says starting, one whose term
// ended and that drains before giving the lock back says stopping. So a
// probe never shows two primaries, even while a new primary takes over.
const (
	RoleStandby  Role = "standby"
	RoleStarting Role = "starting"
	RolePrimary  Role = "primary"
	RoleStopping Role = "stopping"
)

// Role is what an instance is doing in its slot's election.
type Role string

// Paths of the election state relative to the state dir.
const (
	haDir     = "ha"
	lockName  = "primary.lock"
	epochName = "epoch"
)

// LockPath is the primary lock file of stateDir.
func LockPath(stateDir string) string { return filepath.Join(stateDir, haDir, lockName) }

// EpochPath is the epoch file of stateDir.
func EpochPath(stateDir string) string { return filepath.Join(stateDir, haDir, epochName) }

// Elector makes one instance (slot) primary when the lock is free.
type Elector struct {
	StateDir string
	Slot     string
	Logger   *slog.Logger

	probeFS func(string) (fsInfo, error) // tests only; nil is statfs(2) + mountinfo
}

// Term is one tenure as primary. It lasts until Release or process exit.
type Term struct {
	Epoch    uint64
	Slot     string
	Since    time.Time
	LockPath string

	mu sync.Mutex
	f  *os.File // holds the flock; nil once released
}

// WaitPrimary blocks until this instance holds the primary lock, then durably
// bumps the epoch and returns the new term. It takes over the moment the lock
// is free. On ctx cancellation it returns ctx.Err() without bumping the
// epoch.
func (e *Elector) WaitPrimary(ctx context.Context) (*Term, error) {
	log := logging.OrDiscard(e.Logger).With("slot", e.Slot)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	dir := filepath.Join(e.StateDir, haDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create ha dir: %w", err)
	}
	if e.probeFS == nil {
		e.probeFS = probeFS
	}
	if err := checkLocalLock(dir, e.probeFS); err != nil {
		return nil, err
	}
	lockPath := LockPath(e.StateDir)
	f, err := lockFile(ctx, lockPath, log)
	if err != nil {
		return nil, err
	}
	// From here on we are the only writer of the epoch file.
	prev, err := ReadEpoch(e.StateDir)
	if err != nil {
		return nil, errors.Join(err, unlockClose(f))
	}
	epoch := prev + 1
	if err := fsutil.WriteFileAtomic(EpochPath(e.StateDir), []byte(strconv.FormatUint(epoch, 10)+"\n"), 0o644); err != nil {
		return nil, errors.Join(fmt.Errorf("bump epoch: %w", err), unlockClose(f))
	}
	log.Info("became primary", "epoch", epoch, "previous_epoch", prev)
	return &Term{Epoch: epoch, Slot: e.Slot, Since: time.Now(), LockPath: lockPath, f: f}, nil
}

// lockFile opens the lock file and takes the exclusive flock on it, waiting
// for as long as another holder has it.
func lockFile(ctx context.Context, path string, log *slog.Logger) (*os.File, error) {
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return nil, fmt.Errorf("open lock file: %w", err)
		}
		if err := flockCtx(ctx, f, log); err != nil {
			return nil, err // flockCtx owns f on error
		}
		// Defence in depth: if something replaced the file while we waited,
		// our lock is on an orphaned inode and guards nothing.
		if err := sameFile(f, path); err != nil {
			log.Warn("lock file replaced while waiting; retrying", "err", err)
			if err := unlockClose(f); err != nil {
				return nil, err
			}
			continue
		}
		return f, nil
	}
}

// flockCtx takes LOCK_EX on f. The blocking flock runs in a goroutine because
// the syscall cannot be interrupted; if ctx ends first, that goroutine keeps
// waiting and gives the lock back (and closes f) as soon as it gets it.
func flockCtx(ctx context.Context, f *os.File, log *slog.Logger) error {
	fd := int(f.Fd())
	err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EWOULDBLOCK) {
		_ = f.Close()
		return fmt.Errorf("flock %s: %w", f.Name(), err)
	}
	log.Info("standby: waiting for primary lock", "lock", f.Name())
	done := make(chan error, 1)
	go func() { done <- flockRetry(fd, unix.LOCK_EX) }()
	select {
	case err := <-done:
		if err != nil {
			_ = f.Close()
			return fmt.Errorf("flock %s: %w", f.Name(), err)
		}
		return nil
	case <-ctx.Done():
		go func() {
			<-done
			_ = unlockClose(f)
		}()
		return ctx.Err()
	}
}

func flockRetry(fd, how int) error {
	for {
		err := unix.Flock(fd, how)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

func unlockClose(f *os.File) error {
	var errs []error
	if err := flockRetry(int(f.Fd()), unix.LOCK_UN); err != nil {
		errs = append(errs, fmt.Errorf("unlock %s: %w", f.Name(), err))
	}
	if err := f.Close(); err != nil {
		errs = append(errs, fmt.Errorf("close %s: %w", f.Name(), err))
	}
	return errors.Join(errs...)
}

func sameFile(f *os.File, path string) error {
	var a, b unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &a); err != nil {
		return fmt.Errorf("stat held lock: %w", err)
	}
	if err := unix.Stat(path, &b); err != nil {
		return fmt.Errorf("stat lock path: %w", err)
	}
	if a.Dev != b.Dev || a.Ino != b.Ino {
		return fmt.Errorf("lock file %s is inode %d, held lock is on inode %d", path, b.Ino, a.Ino)
	}
	return nil
}

// ErrNotHeld means the term is over: released, or its lock file was replaced
// so the lock no longer excludes anyone.
var ErrNotHeld = errors.New("primary lock not held")

// Held checks that the term still holds the lock on the file at LockPath.
// A primary can call it before acting to fence itself if the lock file was
// tampered with.
func (t *Term) Held() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.f == nil {
		return ErrNotHeld
	}
	if err := sameFile(t.f, t.LockPath); err != nil {
		return fmt.Errorf("%w: %w", ErrNotHeld, err)
	}
	return nil
}

// Release gives the lock back for a graceful handover. Stop all privileged
// work before calling it. Releasing twice is a no-op.
func (t *Term) Release() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.f == nil {
		return nil
	}
	f := t.f
	t.f = nil
	return unlockClose(f)
}

// ReadEpoch returns the last epoch of stateDir, 0 if none was ever taken.
func ReadEpoch(stateDir string) (uint64, error) {
	b, err := os.ReadFile(EpochPath(stateDir))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read epoch: %w", err)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		// Never guess: reusing an epoch would let stale records look current.
		return 0, fmt.Errorf("parse epoch file %s: %w", EpochPath(stateDir), err)
	}
	return n, nil
}
