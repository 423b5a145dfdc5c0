package logging

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// MaxLimitKinds bounds the kinds of line a Limit handler counts apart;
// lines of further kinds share one count.
const MaxLimitKinds = 256

// Limit passes at most burst records of one kind (level and message) per
// interval every to h; the rest of that interval are dropped and counted,
// and the next record of the kind that passes is preceded by one line
// "suppressed similar lines" with the message and the count. It bounds
// the lines something outside the process (a guest's failing I/O, a
// broken bucket) can make a process write: a flood of one kind becomes
// burst lines and a summary per interval. now is the clock (time.Now).
func Limit(h slog.Handler, burst int, every time.Duration, now func() time.Time) slog.Handler {
	return &limitHandler{h: h, st: &limitState{burst: burst, every: every, now: now, kinds: map[limitKey]*limitCount{}}}
}

type limitKey struct {
	level slog.Level
	msg   string
}

type limitCount struct {
	start      time.Time
	passed     int
	suppressed int
}

type limitState struct {
	burst int
	every time.Duration
	now   func() time.Time

	mu    sync.Mutex
	kinds map[limitKey]*limitCount
}

// admit says whether a record of k passes, and how many of its kind the
// interval before it suppressed (to report first).
func (s *limitState) admit(k limitKey) (ok bool, suppressed int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, found := s.kinds[k]
	if !found {
		if len(s.kinds) >= MaxLimitKinds {
			k = limitKey{level: k.level, msg: "(other)"}
			c, found = s.kinds[k]
		}
		if !found {
			c = &limitCount{}
			s.kinds[k] = c
		}
	}
	t := s.now()
	if c.start.IsZero() || t.Sub(c.start) >= s.every {
		suppressed, c.start, c.passed, c.suppressed = c.suppressed, t, 0, 0
	}
	if c.passed >= s.burst {
		c.suppressed++
		return false, 0
	}
	c.passed++
	return true, suppressed
}

type limitHandler struct {
	h  slog.Handler
	st *limitState
}

func (l *limitHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return l.h.Enabled(ctx, level)
}

func (l *limitHandler) Handle(ctx context.Context, r slog.Record) error {
	ok, suppressed := l.st.admit(limitKey{r.Level, r.Message})
	if !ok {
		return nil
	}
	if suppressed > 0 {
		s := slog.NewRecord(r.Time, r.Level, "suppressed similar lines", r.PC)
		s.AddAttrs(slog.String("msg_suppressed", r.Message), slog.Int("count", suppressed), slog.Duration("interval", l.st.every))
		if err := l.h.Handle(ctx, s); err != nil {
			return err
		}
	}
	return l.h.Handle(ctx, r)
}

func (l *limitHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &limitHandler{h: l.h.WithAttrs(as), st: l.st}
}

func (l *limitHandler) WithGroup(name string) slog.Handler {
	return &limitHandler{h: l.h.WithGroup(name), st: l.st}
}
