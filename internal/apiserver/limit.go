package apiserver

import (
	"sync"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
)

// Limiter bounds how many requests of one kind run at once. Beyond the
// bound a request is refused at once (never queued: a queue would only
// move the overload into memory and timeouts) with errdefs.CodeUnavailable and a
// retry hint: the recent average duration of one request of the kind,
// roughly when a slot frees up. A nil *Limiter admits everything.
type Limiter struct {
	kind  string // e.g. "claims", for the message
	flag  string // the setting that raises it, for the message
	slots chan struct{}

	mu  sync.Mutex
	avg time.Duration // moving average of recent durations
}

// NewLimiter admits at most n concurrent requests of kind; guess seeds the
// retry hint until some have finished. n < 1 means no limit (nil).
func NewLimiter(kind, flag string, n int, guess time.Duration) *Limiter {
	if n < 1 {
		return nil
	}
	return &Limiter{kind: kind, flag: flag, slots: make(chan struct{}, n), avg: guess}
}

// Acquire takes a slot or returns a busy error. The caller must call the
// returned release exactly once when the request is done.
func (l *Limiter) Acquire() (release func(), err error) {
	if l == nil {
		return func() {}, nil
	}
	select {
	case l.slots <- struct{}{}:
	default:
		return nil, errdefs.Busy(l.RetryAfter(), "%d %s already running on this node (limit %s=%d); retry later",
			cap(l.slots), l.kind, l.flag, cap(l.slots))
	}
	start := time.Now()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.observe(time.Since(start))
			<-l.slots
		})
	}, nil
}

// RetryAfter is the current retry hint, between 1 s and 1 min.
func (l *Limiter) RetryAfter() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return min(max(l.avg, time.Second), time.Minute)
}

func (l *Limiter) observe(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	// Weight 1/4: follows a change in a few requests, ignores one outlier.
	l.avg += (d - l.avg) / 4
}

// InUse reports the slots taken (for tests and status).
func (l *Limiter) InUse() int {
	if l == nil {
		return 0
	}
	return len(l.slots)
}
