package exitwatch

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/logging"
)

// Ended says whether a watched generation's guest ended (or said it
// did); the node's: its agent's exit report is there, or its lease has no
// process left.
type Ended func(ctx context.Context) (bool, error)

// DefaultInterval is the watch's fallback: every watched generation is
// looked at this often even without a notification.
const DefaultInterval = time.Second

// Watcher calls a generation's gone function once, the moment its Ended
// says so. Each watch names the files whose change may mean the end: the
// lease's cgroup.events (the kernel notifies a change of it as a
// modification, inotify IN_MODIFY) and the agent's socket directory (the
// exit report is renamed into it); a change of one wakes the watch at
// once. A look at every watch each Interval covers a notification missed
// (a path that could not be watched, a fake kernel).
type Watcher struct {
	interval time.Duration
	log      *slog.Logger

	mu     sync.Mutex
	leases map[string]*watch // watch id → its watch
	wds    map[int32]string  // inotify watch → watch id
	fd     int               // inotify; -1 when unavailable
	closed bool
}

type watch struct {
	wds   []int32
	ended Ended
	gone  func()
}

// New makes a watcher; Run serves it until its context ends.
func New(interval time.Duration, log *slog.Logger) *Watcher {
	if interval <= 0 {
		interval = DefaultInterval
	}
	w := &Watcher{interval: interval, log: logging.OrDiscard(log),
		leases: map[string]*watch{}, wds: map[int32]string{}, fd: -1}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		w.log.Warn("exit watch without inotify: leases are looked at every interval", "interval", interval, "err", err)
	} else {
		w.fd = fd
	}
	return w
}

// Watch arms id: gone runs once (in a goroutine of its own) when ended
// says so, which may be at once. paths are the files and directories
// whose change may mean the end (watched for modification, and for files
// created or renamed into a directory). Arming a watched id again
// replaces it.
func (w *Watcher) Watch(ctx context.Context, id string, paths []string, ended Ended, gone func()) {
	wt := &watch{ended: ended, gone: gone}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	w.dropLocked(id)
	for _, p := range paths {
		if w.fd < 0 || p == "" {
			continue
		}
		wd, err := unix.InotifyAddWatch(w.fd, p, unix.IN_MODIFY|unix.IN_MOVED_TO|unix.IN_CREATE)
		if err != nil {
			w.log.Debug("no inotify watch; looked at every interval", "watch", id, "path", p, "err", err)
			continue
		}
		wt.wds = append(wt.wds, int32(wd))
		w.wds[int32(wd)] = id
	}
	w.leases[id] = wt
	w.mu.Unlock()
	// The guest may be gone already (an exit before the watch, or while
	// no primary watched).
	w.check(ctx, id)
}

// Stop disarms lease id (a release ends the guest on purpose).
func (w *Watcher) Stop(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.dropLocked(id)
}

func (w *Watcher) dropLocked(id string) *watch {
	wt, ok := w.leases[id]
	if !ok {
		return nil
	}
	delete(w.leases, id)
	for _, wd := range wt.wds {
		delete(w.wds, wd)
		unix.InotifyRmWatch(w.fd, uint32(wd)) // the path may be gone: EINVAL
	}
	return wt
}

// Watched lists the armed watches.
func (w *Watcher) Watched() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]string, 0, len(w.leases))
	for id := range w.leases {
		out = append(out, id)
	}
	return out
}

// check fires id's gone if its ended says so.
func (w *Watcher) check(ctx context.Context, id string) {
	w.mu.Lock()
	wt, ok := w.leases[id]
	w.mu.Unlock()
	if !ok {
		return
	}
	ended, err := wt.ended(ctx)
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn("exit watch: look at the guest", "watch", id, "err", err)
		}
		return
	}
	if !ended {
		return
	}
	w.mu.Lock()
	cur := w.dropLocked(id)
	w.mu.Unlock()
	if cur != nil {
		go cur.gone()
	}
}

// Run waits for notifications and looks at every lease each interval,
// until ctx ends; then the watcher is closed (Watch does nothing).
func (w *Watcher) Run(ctx context.Context) {
	defer w.close()
	buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	next := time.Now().Add(w.interval)
	for ctx.Err() == nil {
		wait := time.Until(next)
		if wait < 0 {
			wait = 0
		}
		if wait > w.interval {
			wait = w.interval
		}
		fired := w.wait(buf, wait)
		if ctx.Err() != nil {
			return
		}
		if time.Now().After(next) {
			fired = w.Watched()
			next = time.Now().Add(w.interval)
		}
		for _, id := range fired {
			w.check(ctx, id)
		}
	}
}

// wait blocks up to d for inotify events and returns the leases they
// name. The poll is bounded by d (at most the interval), so Run sees its
// context's end within an interval.
func (w *Watcher) wait(buf []byte, d time.Duration) []string {
	if w.fd < 0 {
		time.Sleep(d)
		return nil
	}
	fds := []unix.PollFd{{Fd: int32(w.fd), Events: unix.POLLIN}}
	if _, err := unix.Poll(fds, int(d.Milliseconds())+1); err != nil && !errors.Is(err, unix.EINTR) {
		time.Sleep(d)
		return nil
	}
	var out []string
	for {
		n, err := unix.Read(w.fd, buf)
		if n <= 0 || err != nil {
			return out
		}
		w.mu.Lock()
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			// struct inotify_event: wd, mask, cookie, len, then name.
			wd := int32(binary.NativeEndian.Uint32(buf[off:]))
			if id, ok := w.wds[wd]; ok && !slices.Contains(out, id) {
				out = append(out, id)
			}
			off += unix.SizeofInotifyEvent + int(binary.NativeEndian.Uint32(buf[off+12:]))
		}
		w.mu.Unlock()
	}
}

func (w *Watcher) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	for id := range w.leases {
		w.dropLocked(id)
	}
	if w.fd >= 0 {
		unix.Close(w.fd)
		w.fd = -1
	}
}
