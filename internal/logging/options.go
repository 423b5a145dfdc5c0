package logging

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/spf13/pflag"
)

// Options choose a process logger's level and line format, and whether
// each line starts with its syslog priority for journald.
type Options struct {
	Level  slog.Level
	Format string // "text" (default) or "json"
	// Journald prefixes each line with "<N>", N the syslog priority of
	// its level, which journald strips and records as the priority.
	Journald bool
}

// ParseLevel reads a --log-level: debug, info, warn or error.
func ParseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("log level %q is not one of debug, info, warn, error", s)
}

// ParseFormat checks a --log-format: text or json.
func ParseFormat(s string) (string, error) {
	switch s {
	case "text", "json":
		return s, nil
	}
	return "", fmt.Errorf("log format %q is not text or json", s)
}

// NewWith is a process's logger on w per o.
func NewWith(w io.Writer, o Options) *slog.Logger {
	mk := func(w io.Writer) slog.Handler {
		ho := &slog.HandlerOptions{Level: o.Level}
		if o.Format == "json" {
			return slog.NewJSONHandler(w, ho)
		}
		return slog.NewTextHandler(w, ho)
	}
	if !o.Journald {
		return slog.New(mk(w))
	}
	return slog.New(&journalHandler{mk: mk, level: o.Level, out: &lockedWriter{w: w}})
}

// UnderJournald says stderr is the journal's stream: systemd sets
// JOURNAL_STREAM to its "device:inode" (see systemd.exec(5)); a stderr
// redirected elsewhere by the unit's command does not match.
func UnderJournald(getenv func(string) string, stderr *os.File) bool {
	v := getenv("JOURNAL_STREAM")
	dev, ino, ok := strings.Cut(v, ":")
	if !ok || stderr == nil {
		return false
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(stderr.Fd()), &st); err != nil {
		return false
	}
	return strconv.FormatUint(uint64(st.Dev), 10) == dev && strconv.FormatUint(st.Ino, 10) == ino
}

// Priority is the syslog priority journald records for a level.
func Priority(l slog.Level) int {
	switch {
	case l >= slog.LevelError:
		return 3 // err
	case l >= slog.LevelWarn:
		return 4 // warning
	case l >= slog.LevelInfo:
		return 6 // info
	}
	return 7 // debug
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

// journalHandler formats each record with a fresh handler over a buffer
// (replaying WithAttrs/WithGroup) and writes it whole with its "<N>"
// prefix: the standard handlers write a line without knowing of a prefix.
type journalHandler struct {
	mk    func(io.Writer) slog.Handler
	level slog.Leveler
	out   *lockedWriter
	ops   []func(slog.Handler) slog.Handler
}

func (h *journalHandler) Enabled(_ context.Context, l slog.Level) bool {
	return l >= h.level.Level()
}

func (h *journalHandler) Handle(ctx context.Context, r slog.Record) error {
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "<%d>", Priority(r.Level))
	inner := h.mk(&buf)
	for _, op := range h.ops {
		inner = op(inner)
	}
	if err := inner.Handle(ctx, r); err != nil {
		return err
	}
	h.out.mu.Lock()
	defer h.out.mu.Unlock()
	_, err := h.out.w.Write(buf.Bytes())
	return err
}

func (h *journalHandler) with(op func(slog.Handler) slog.Handler) *journalHandler {
	c := *h
	c.ops = append(append([]func(slog.Handler) slog.Handler(nil), h.ops...), op)
	return &c
}

func (h *journalHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return h.with(func(in slog.Handler) slog.Handler { return in.WithAttrs(as) })
}

func (h *journalHandler) WithGroup(name string) slog.Handler {
	return h.with(func(in slog.Handler) slog.Handler { return in.WithGroup(name) })
}

// Flags are the --log-level and --log-format flags of a command.
type Flags struct {
	Level, Format string
}

// Register adds the flags to fs.
func (f *Flags) Register(fs *pflag.FlagSet) {
	fs.StringVar(&f.Level, "log-level", "info", "least level logged: debug, info, warn or error")
	fs.StringVar(&f.Format, "log-format", "text", "log line format: text (logfmt) or json")
}

// Options checks the flags; journald says lines get their priority prefix.
func (f *Flags) Options(journald bool) (Options, error) {
	l, err := ParseLevel(f.Level)
	if err != nil {
		return Options{}, fmt.Errorf("--log-level: %w", err)
	}
	fm, err := ParseFormat(f.Format)
	if err != nil {
		return Options{}, fmt.Errorf("--log-format: %w", err)
	}
	return Options{Level: l, Format: fm, Journald: journald}, nil
}
