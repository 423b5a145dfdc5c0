package runsc

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
)

// panicHead bounds what PanicSummary reads of a panic log: a Go crash
// says what happened in its first lines, then dumps every goroutine
// (thousands in a sentry), so its tail says nothing useful.
const panicHead = 64 << 10

// PanicSummary is what a sandbox's or gofer's panic log (PanicLogFile)
// says happened, for a readiness failure's message: its lines that start
// a Go panic or fatal error ("panic: ", "fatal error: ", "runtime: ") in
// its first 64 KiB, else its first lines; at most maxLines lines and
// maxBytes bytes. An empty or missing log is "".
func PanicSummary(path string, maxLines, maxBytes int) (string, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read panic log: %w", err)
	}
	defer f.Close()
	var marked, first [][]byte
	sc := bufio.NewScanner(io.LimitReader(f, panicHead))
	sc.Buffer(make([]byte, 0, 4096), panicHead)
	for sc.Scan() && len(marked) < maxLines {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		if len(first) < maxLines {
			first = append(first, bytes.Clone(line))
		}
		for _, p := range []string{"panic: ", "fatal error: ", "runtime: "} {
			if bytes.HasPrefix(line, []byte(p)) {
				marked = append(marked, bytes.Clone(line))
				break
			}
		}
	}
	if err := sc.Err(); err != nil && !errors.Is(err, bufio.ErrTooLong) {
		return "", fmt.Errorf("read panic log: %w", err)
	}
	lines := marked
	if len(lines) == 0 {
		lines = first
	}
	out := string(bytes.Join(lines, []byte("\n")))
	if len(out) > maxBytes {
		out = out[:maxBytes] + "..."
	}
	return out, nil
}
