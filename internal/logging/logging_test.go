package logging

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

func TestNewWritesFromLevelUp(t *testing.T) {
	var b bytes.Buffer
	l := New(&b, slog.LevelInfo).With("slot", "a")
	l.Debug("hidden")
	l.Info("took the lock", "epoch", 3)
	if got := b.String(); strings.Contains(got, "hidden") || !strings.Contains(got, `level=INFO msg="took the lock" slot=a epoch=3`) {
		t.Fatalf("log = %q", got)
	}
}

func TestOrDiscard(t *testing.T) {
	var b bytes.Buffer
	l := New(&b, slog.LevelDebug)
	if OrDiscard(l) != l {
		t.Fatal("OrDiscard replaced a given logger")
	}
	// A nil logger becomes one that drops everything, not slog.Default.
	var def bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(New(&def, slog.LevelDebug))
	t.Cleanup(func() { slog.SetDefault(prev) })
	d := OrDiscard(nil)
	d.Error("dropped")
	if d.Enabled(t.Context(), slog.LevelError) || def.Len() != 0 {
		t.Fatalf("OrDiscard(nil) logged: enabled %v, default got %q", d.Enabled(t.Context(), slog.LevelError), def.String())
	}
}
