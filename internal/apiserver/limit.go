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

// KeyedLimiter bounds how many requests of one kind run at once per key
// (a sandbox), so one sandbox's callers cannot take all of a node-wide
// limit. Beyond it a request is refused at once as Limiter does, with the
// same retry hint. A nil *KeyedLimiter admits everything.
type KeyedLimiter struct {
	kind, flag string
	n          int

	mu    sync.Mutex
	inUse map[string]int
	avg   time.Duration
}

// NewKeyedLimiter admits at most n concurrent requests of kind per key;
// n < 1 means no limit (nil).
func NewKeyedLimiter(kind, flag string, n int, guess time.Duration) *KeyedLimiter {
	if n < 1 {
		return nil
	}
	return &KeyedLimiter{kind: kind, flag: flag, n: n, inUse: map[string]int{}, avg: guess}
}

// Acquire takes a slot of key or returns a busy error; the caller calls
// the returned release exactly once.
func (l *KeyedLimiter) Acquire(key string) (release func(), err error) {
	if l == nil {
		return func() {}, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inUse[key] >= l.n {
		return nil, errdefs.Busy(min(max(l.avg, time.Second), time.Minute), "%d %s already running in sandbox %s (limit %s=%d); retry later",
			l.n, l.kind, key, l.flag, l.n)
	}
	l.inUse[key]++
	start := time.Now()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.inUse[key]--; l.inUse[key] == 0 {
				delete(l.inUse, key) // the map holds only keys in use
			}
			l.avg += (time.Since(start) - l.avg) / 4
		})
	}, nil
}

// InUse reports key's slots taken (tests, status).
func (l *KeyedLimiter) InUse(key string) int {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.inUse[key]
}

// acquireBoth takes a slot of key in per and one in node, or neither.
func acquireBoth(per *KeyedLimiter, key string, node *Limiter) (func(), error) {
	r1, err := per.Acquire(key)
	if err != nil {
		return nil, err
	}
	r2, err := node.Acquire()
	if err != nil {
		r1()
		return nil, err
	}
	return func() { r2(); r1() }, nil
}
