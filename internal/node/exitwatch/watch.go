package exitwatch

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/logging"
)

// Probe says whether a lease still has processes (lease.Manager's
// Populated: the whole subtree, from cgroup.events).
type Probe interface {
	Populated(ctx context.Context, id string) (bool, error)
}

// DefaultInterval is the watch's fallback: every watched lease is looked
// at this often even without a cgroup.events notification.
const DefaultInterval = time.Second

// Watcher calls a lease's gone function once, the moment its cgroup is no
// longer populated. The kernel notifies a change of cgroup.events as a
// modification (inotify IN_MODIFY), so the watch wakes at once; a look at
// every lease each Interval covers a notification missed (a lease whose
// file could not be watched, a fake kernel).
type Watcher struct {
	probe    Probe
	interval time.Duration
	log      *slog.Logger

	mu     sync.Mutex
	leases map[string]*watch // lease id → its watch
	wds    map[int32]string  // inotify watch → lease id
	fd     int               // inotify; -1 when unavailable
	closed bool
}

type watch struct {
	wd   int32 // -1: no inotify watch
	gone func()
}

// New makes a watcher; Run serves it until its context ends.
func New(probe Probe, interval time.Duration, log *slog.Logger) *Watcher {
	if interval <= 0 {
		interval = DefaultInterval
	}
	w := &Watcher{probe: probe, interval: interval, log: logging.OrDiscard(log),
		leases: map[string]*watch{}, wds: map[int32]string{}, fd: -1}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		w.log.Warn("exit watch without inotify: leases are looked at every interval", "interval", interval, "err", err)
	} else {
		w.fd = fd
	}
	return w
}

// Watch arms lease id: gone runs once (in a goroutine of its own) when
// the lease has no process left, which may be at once. eventsPath is the
// lease's cgroup.events. Arming a watched lease again replaces its gone.
func (w *Watcher) Watch(ctx context.Context, id, eventsPath string, gone func()) {
	wt := &watch{wd: -1, gone: gone}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	if old, ok := w.leases[id]; ok {
		wt.wd = old.wd
	} else if w.fd >= 0 && eventsPath != "" {
		wd, err := unix.InotifyAddWatch(w.fd, eventsPath, unix.IN_MODIFY)
		if err != nil {
			w.log.Debug("no inotify watch on cgroup.events; looked at every interval", "lease", id, "path", eventsPath, "err", err)
		} else {
			wt.wd = int32(wd)
			w.wds[wt.wd] = id
		}
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
	if wt.wd >= 0 {
		delete(w.wds, wt.wd)
		unix.InotifyRmWatch(w.fd, uint32(wt.wd)) // the cgroup may be gone: EINVAL
	}
	return wt
}

// Watched lists the armed leases.
func (w *Watcher) Watched() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]string, 0, len(w.leases))
	for id := range w.leases {
		out = append(out, id)
	}
	return out
}

// check fires lease id's gone if the lease has no process left.
func (w *Watcher) check(ctx context.Context, id string) {
	pop, err := w.probe.Populated(ctx, id)
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn("exit watch: read lease", "lease", id, "err", err)
		}
		return
	}
	if pop {
		return
	}
	w.mu.Lock()
	wt := w.dropLocked(id)
	w.mu.Unlock()
	if wt != nil {
		go wt.gone()
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
			if id, ok := w.wds[wd]; ok {
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
