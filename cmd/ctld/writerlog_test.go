package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/writer"
)

// TestWriterLogBounded (issue 21): a guest that makes its writer fail
// request after request (a line each) gets writer.LogBurst lines per
// interval and a summary, and the log file stays under its cap however
// many kinds of line a flood mixes.
func TestWriterLogBounded(t *testing.T) {
	dir := t.TempDir()
	logPath := filepath.Join(dir, writer.LogName)
	f, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	now := time.Date(2026, 12, 6, 15, 0, 0, 0, time.UTC)
	log := writerLogger(f, filepath.Join(dir, writer.SpecName), func() time.Time { return now })
	for i := range 100_000 {
		log.Warn("nbd request failed", "cmd", "read", "offset", i*4096, "err", "fetch chunk: object not found")
	}
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "nbd request failed"); n != writer.LogBurst {
		t.Fatalf("%d lines of the flood in the log, want %d", n, writer.LogBurst)
	}
	now = now.Add(writer.LogEvery)
	log.Warn("nbd request failed", "offset", 0)
	if b, _ = os.ReadFile(logPath); !strings.Contains(string(b), "suppressed similar lines") || !strings.Contains(string(b), "count=99980") {
		t.Fatalf("no summary of the suppressed lines:\n%s", b)
	}
	// Long lines of many kinds, each interval anew: the cap holds.
	for round := range 50 {
		now = now.Add(writer.LogEvery)
		for k := range 200 {
			log.Error("chunk fetch failed "+strings.Repeat("x", k), "round", round, "detail", strings.Repeat("y", 300))
		}
	}
	cur, _ := os.Stat(logPath)
	old, _ := os.Stat(logPath + ".1")
	if cur.Size() > writer.LogMax+writer.LogMax/4 || old == nil || old.Size() > writer.LogMax/2 {
		t.Fatalf("log %d bytes, old half %v; want at most %d and %d", cur.Size(), old, writer.LogMax+writer.LogMax/4, writer.LogMax/2)
	}
}
