// Package logging is the one way ctld builds loggers: New for a process
// (each command writes text lines to its stderr), OrDiscard for a component
// that was given none. Loggers are passed in; nothing here is global.
package logging

import (
	"io"
	"log/slog"
)

// New is a process's logger: text lines on w from level up.
func New(w io.Writer, level slog.Leveler) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

// OrDiscard is l, or a logger that drops everything when l is nil: a
// component given no logger stays quiet rather than writing to the
// process-global slog.Default.
func OrDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
