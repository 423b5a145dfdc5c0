package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/ctld/ctld/internal/manager"
	"github.com/ctld/ctld/internal/template"
)

// pullProgress reports a registry pull on stderr: a bar redrawn in place
// on a terminal, else a plain line per finished layer and at most one a
// second between.
func (c *cli) pullProgress() func(template.PullProgress) {
	tty := c.ttyErr
	interval := time.Second
	if tty {
		interval = 100 * time.Millisecond
	}
	var last time.Time
	done := -1
	return func(p template.PullProgress) {
		now := time.Now()
		// A finished layer is always shown; progress within one at most
		// once an interval.
		if p.LayersDone == done && now.Sub(last) < interval {
			return
		}
		finished := p.LayersDone == p.Layers
		last, done = now, p.LayersDone
		if tty {
			fmt.Fprintf(c.stderr, "\r\x1b[K%s", pullBar(p, now, 30))
			if finished {
				fmt.Fprintln(c.stderr)
			}
			return
		}
		fmt.Fprintln(c.stderr, pullLine(p, now))
	}
}

// pullLine is a pull's state as one plain line.
func pullLine(p template.PullProgress, now time.Time) string {
	return fmt.Sprintf("pull: layers %d/%d (%d cached), %s of %s%s", p.LayersDone, p.Layers, p.Cached,
		manager.FormatMemory(p.BytesDone), manager.FormatMemory(p.Bytes), eta(p, now))
}

// pullBar is a pull's state as a bar of width cells and the same counts.
func pullBar(p template.PullProgress, now time.Time, width int) string {
	filled := width
	if p.Bytes > 0 {
		filled = int(int64(width) * p.BytesDone / p.Bytes)
	}
	return fmt.Sprintf("[%s%s] %s", strings.Repeat("=", filled), strings.Repeat(" ", width-filled), strings.TrimPrefix(pullLine(p, now), "pull: "))
}

// eta is ", ETA 12s" from the rate so far, once there is one.
func eta(p template.PullProgress, now time.Time) string {
	el := now.Sub(p.Started)
	if p.BytesDone <= 0 || p.BytesDone >= p.Bytes || el < 500*time.Millisecond {
		return ""
	}
	left := time.Duration(float64(el) * float64(p.Bytes-p.BytesDone) / float64(p.BytesDone))
	return fmt.Sprintf(", ETA %s", left.Round(time.Second))
}
