package errdefs

import (
	"errors"
	"fmt"
	"io/fs"
	"testing"
	"time"
)

func TestCodeOf(t *testing.T) {
	cases := []struct {
		err  error
		want Code
	}{
		{nil, ""},
		{Errorf(CodeNotFound, "sandbox %q", "a"), CodeNotFound},
		{fmt.Errorf("claim sandbox: %w", Errorf(CodeFenced, "epoch 3 < 4")), CodeFenced},
		{errors.New("disk on fire"), CodeInternal},
		{&Error{Message: "no code"}, CodeInternal},
		{fmt.Errorf("journal sandbox: %w", ownKind{}), CodeFenced},
		{errors.Join(errors.New("first"), fmt.Errorf("second: %w", ownKind{})), CodeFenced},
	}
	for _, c := range cases {
		if got := CodeOf(c.err); got != c.want {
			t.Errorf("CodeOf(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}

// ownKind is a package's own error type that knows its kind.
type ownKind struct{}

func (ownKind) Error() string   { return "own kind" }
func (ownKind) ErrorCode() Code { return CodeFenced }

func TestIs(t *testing.T) {
	err := fmt.Errorf("release: %w", Errorf(CodeConflict, "generation 2 is not current"))
	if !Is(err, CodeConflict) {
		t.Errorf("Is(%v, conflict) = false", err)
	}
	if Is(err, CodeNotFound) {
		t.Errorf("Is(%v, not_found) = true", err)
	}
	if Is(nil, CodeInternal) {
		t.Error("Is(nil, internal) = true")
	}
	if !Is(errors.New("plain"), CodeInternal) {
		t.Error("a plain error is not internal")
	}
}

func TestErrorfKeepsCause(t *testing.T) {
	err := Errorf(CodeNotFound, "open template: %w", fs.ErrNotExist)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("errors.Is(%v, fs.ErrNotExist) = false, want true", err)
	}
	if want := "not_found: open template: file does not exist"; err.Error() != want {
		t.Errorf("Error() = %q, want %q", err.Error(), want)
	}
	if err.Message != "open template: file does not exist" {
		t.Errorf("Message = %q", err.Message)
	}
}

func TestBusy(t *testing.T) {
	err := fmt.Errorf("claim: %w", Busy(10*time.Millisecond, "%d claims running", 4))
	if CodeOf(err) != CodeUnavailable {
		t.Errorf("CodeOf = %q, want unavailable", CodeOf(err))
	}
	// The hint is at least a second: the wire carries whole seconds.
	if got := RetryAfterOf(err); got != time.Second {
		t.Errorf("RetryAfterOf = %v, want 1s", got)
	}
	if got := RetryAfterOf(errors.New("x")); got != 0 {
		t.Errorf("RetryAfterOf(plain) = %v, want 0", got)
	}
}
