package names

import (
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/errdefs"
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
		err := CheckID("sandbox id", s)
		if want && err != nil || !want && errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
			t.Errorf("CheckID(%q) = %v, want ok=%v as invalid_argument", s, err, want)
		}
	}
}

func TestCheckID(t *testing.T) {
	good := []string{"a", "0", "sb-1", "a-b-c", strings.Repeat("a", 63), "9abc"}
	bad := []string{"", "-a", "a-", "A", "a_b", "a.b", "../x", "..", "a/b", "/", "a\x00b", "é", "sb\u200b", strings.Repeat("a", 64), strings.Repeat("a", 300), " a", "a\n"}
	for _, s := range good {
		if err := CheckID("sandbox id", s); err != nil {
			t.Errorf("CheckID(%q) = %v, want nil", s, err)
		}
	}
	for _, s := range bad {
		err := CheckID("sandbox id", s)
		if err == nil {
			t.Errorf("CheckID(%q) = nil, want error", s)
			continue
		}
		msg := err.Error()
		if errdefs.CodeOf(err) != errdefs.CodeInvalidArgument || !strings.Contains(msg, "sandbox id") || !strings.Contains(msg, "1-63 characters") {
			t.Errorf("CheckID(%q) = %q: want invalid_argument naming the kind and the rule", s, msg)
		}
		if len(msg) > 300 {
			t.Errorf("CheckID(%d bytes) message is %d bytes: want it cut short", len(s), len(msg))
		}
	}
}

func TestCheckIDMessage(t *testing.T) {
	if err := CheckID("sandbox id", ""); err == nil || err.Error() != "invalid_argument: sandbox id is empty: "+Rule {
		t.Errorf("empty: %v", err)
	}
	if err := CheckID("netns name", "a/b"); err == nil || err.Error() != `invalid_argument: invalid netns name "a/b": `+Rule {
		t.Errorf("a/b: %v", err)
	}
	// A huge value is cut short in the message.
	if err := CheckID("sandbox id", strings.Repeat("x/", 1<<20)); err == nil || len(err.Error()) > 400 {
		t.Errorf("huge id: message of %d bytes", len(err.Error()))
	}
}

func TestGeneration(t *testing.T) {
	if g := Generation("sb", 12); g != "sb-g12" {
		t.Fatalf("Generation = %q", g)
	}
	if !Valid(Generation("sb", 12)) {
		t.Fatal("a generation name must itself be a valid ID")
	}
	if err := CheckGeneration(strings.Repeat("a", 60), 1); err != nil {
		t.Fatalf("63-character generation name refused: %v", err)
	}
	if err := CheckGeneration(strings.Repeat("a", 60), 10); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument || !strings.Contains(err.Error(), "more than 63") {
		t.Fatalf("64-character generation name: %v", err)
	}
	if err := CheckGeneration("A", 1); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
		t.Fatalf("invalid sandbox id: %v", err)
	}
	if err := CheckGeneration("sb", 0); errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
		t.Fatalf("generation 0: %v", err)
	}
}

func TestParseGeneration(t *testing.T) {
	for s, want := range map[string]bool{
		"sb-g1": true, "a-b-c-g12": true, "sb-g0": false, "sb-g01": false, "sb-g": false, "-g1": false,
		"sb": false, "runsc": false, "Sb-g1": false, "sb_x-g1": false, "sb-g1x": false, "sb-g+1": false,
		strings.Repeat("a", 61) + "-g1": false, strings.Repeat("a", 60) + "-g1": true,
	} {
		id, gen, ok := ParseGeneration(s)
		if ok != want {
			t.Errorf("ParseGeneration(%q) ok = %v, want %v", s, ok, want)
			continue
		}
		if ok && Generation(id, gen) != s {
			t.Errorf("ParseGeneration(%q) = %q, %d: does not name it back", s, id, gen)
		}
	}
	if id, gen, _ := ParseGeneration("a-b-c-g12"); id != "a-b-c" || gen != 12 {
		t.Errorf("ParseGeneration(a-b-c-g12) = %q, %d", id, gen)
	}
}
