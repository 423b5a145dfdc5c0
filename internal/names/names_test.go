package names

import (
	"strings"
	"testing"
)

func TestValid(t *testing.T) {
	for s, want := range map[string]bool{
		"a": true, "sb-1": true, "0abc": true, strings.Repeat("a", 63): true,
		"": false, strings.Repeat("a", 64): false, "-a": false, "a-": false, "A": false,
		"a.b": false, "a/b": false, "..": false, "a\x00": false, "é": false,
	} {
		if got := Valid(s); got != want {
			t.Errorf("Valid(%q) = %v, want %v", s, got, want)
		}
	}
}

func TestGeneration(t *testing.T) {
	if g := Generation("sb", 12); g != "sb-g12" {
		t.Fatalf("Generation = %q", g)
	}
	if !Valid(Generation("sb", 12)) {
		t.Fatal("a generation name must itself be a valid ID")
	}
	if why := CheckGeneration(strings.Repeat("a", 60), 1); why != "" {
		t.Fatalf("63-character generation name refused: %s", why)
	}
	if why := CheckGeneration(strings.Repeat("a", 60), 10); !strings.Contains(why, "more than 63") {
		t.Fatalf("64-character generation name: %q", why)
	}
	if why := CheckGeneration("A", 1); why == "" {
		t.Fatal("invalid sandbox id accepted")
	}
}
