package main

import (
	"io"
	"os"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/term"
)

// Guest-controlled text (file names, link targets, an agent's error
// messages) must not drive the operator's terminal: on a terminal,
// control characters (C0, DEL, C1: escape sequences, carriage returns)
// and invalid UTF-8 are shown escaped as strconv.Quote writes them,
// without the quotes; everything else, and all output that is not a
// terminal (pipes, files, --json), stays exact. Raw streams (exec
// output, file get, logs) are the caller's bytes and are never touched.

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// escapeControl escapes s's control characters and invalid bytes.
func escapeControl(s string) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || unicode.IsControl(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			b.WriteString(`\x`)
			b.WriteString(strconv.FormatUint(uint64(s[i])>>4, 16))
			b.WriteString(strconv.FormatUint(uint64(s[i])&0xf, 16))
		case unicode.IsControl(r):
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// outText is s as printed on stdout: escaped on a terminal.
func (c *cli) outText(s string) string {
	if c.ttyOut {
		return escapeControl(s)
	}
	return s
}

// errText is s as printed on stderr: escaped on a terminal.
func (c *cli) errText(s string) string {
	if c.ttyErr {
		return escapeControl(s)
	}
	return s
}
