package main

import "testing"

func TestEscapeControl(t *testing.T) {
	for in, want := range map[string]string{
		"plain name.txt":     "plain name.txt",
		"ünïcode ✓":          "ünïcode ✓",
		"a\x1b[31mred":       `a\x1b[31mred`,
		"cr\rnl\ntab\t":      `cr\rnl\ntab\t`,
		"del\x7f c1\u0085":   `del\x7f c1\u0085`,
		"bad\xff\xfe utf8":   `bad\xff\xfe utf8`,
		"bell\a":             `bell\a`,
		"\u202e not control": "\u202e not control", // format chars are not escaped (control characters only)
	} {
		if got := escapeControl(in); got != want {
			t.Errorf("escapeControl(%q) = %q, want %q", in, got, want)
		}
	}
}
