package logging

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestLimit: of a flood of one kind of line, burst pass per interval and
// the rest are counted, then reported in one summary line before the
// next that passes; other kinds pass meanwhile; loggers derived With
// share the count; the kinds counted apart are bounded.
func TestLimit(t *testing.T) {
	var buf bytes.Buffer
	now := time.Date(2026, 12, 6, 15, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	log := slog.New(Limit(slog.NewTextHandler(&buf, nil), 3, time.Minute, clock))
	for i := range 100 {
		log.With("i", i).Warn("nbd request failed", "offset", i)
	}
	log.Info("other kind")
	if n := strings.Count(buf.String(), "nbd request failed"); n != 3 {
		t.Fatalf("%d lines of the flood passed, want 3:\n%s", n, buf.String())
	}
	if !strings.Contains(buf.String(), "other kind") {
		t.Fatal("a line of another kind was dropped")
	}
	buf.Reset()
	now = now.Add(time.Minute)
	log.Warn("nbd request failed", "offset", 100)
	out := buf.String()
	if !strings.Contains(out, `msg="suppressed similar lines" msg_suppressed="nbd request failed" count=97`) || !strings.Contains(out, "offset=100") {
		t.Fatalf("after the interval:\n%s\nwant the summary of 97, then the line", out)
	}
	buf.Reset()
	for i := range 10 * MaxLimitKinds {
		log.Error(fmt.Sprintf("kind %d", i))
	}
	if n := strings.Count(buf.String(), "\n"); n > MaxLimitKinds+3 {
		t.Fatalf("%d lines of %d kinds passed, want at most %d", n, 10*MaxLimitKinds, MaxLimitKinds+3)
	}
}
