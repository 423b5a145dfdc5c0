package api

import (
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"testing"
)

func TestHTTPStatus(t *testing.T) {
	for code, want := range map[Code]int{
		CodeInvalidArgument:   http.StatusBadRequest,
		CodeNotFound:          http.StatusNotFound,
		CodeConflict:          http.StatusConflict,
		CodeCapacityExhausted: http.StatusTooManyRequests,
		CodeFenced:            http.StatusConflict,
		CodeNotPrimary:        http.StatusServiceUnavailable,
		CodeUnavailable:       http.StatusServiceUnavailable,
		CodePermissionDenied:  http.StatusForbidden,
		CodeInternal:          http.StatusInternalServerError,
		Code("bogus"):         http.StatusInternalServerError,
	} {
		if got := HTTPStatus(code); got != want {
			t.Errorf("HTTPStatus(%q) = %d, want %d", code, got, want)
		}
	}
}

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
	}
	for _, c := range cases {
		if got := CodeOf(c.err); got != c.want {
			t.Errorf("CodeOf(%v) = %q, want %q", c.err, got, c.want)
		}
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
