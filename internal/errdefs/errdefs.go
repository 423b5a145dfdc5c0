// Package errdefs holds the fixed set of kinds of error ctld reports, the
// typed *Error that carries one, the Coder interface by which a package's
// own error types say their kind, and helpers to read the kind back from a
// wrapped error. Errors compose with %w; only the API server maps a kind
// to an HTTP status, and only the API client turns a wire error back into
// an *Error. It imports nothing of the transport, so kernel-facing packages
// can use it without linking net/http.
package errdefs

import (
	"errors"
	"fmt"
	"time"
)

// Code is one of a small fixed set of error kinds.
type Code string

const (
	CodeInvalidArgument   Code = "invalid_argument"
	CodeNotFound          Code = "not_found"
	CodeConflict          Code = "conflict"
	CodeCapacityExhausted Code = "capacity_exhausted"
	CodeFenced            Code = "fenced"
	CodeNotPrimary        Code = "not_primary"
	CodeUnavailable       Code = "unavailable"
	CodePermissionDenied  Code = "permission_denied"
	CodeInternal          Code = "internal"
)

// Codes lists every code, for the transport's tables and their tests.
var Codes = []Code{
	CodeInvalidArgument, CodeNotFound, CodeConflict, CodeCapacityExhausted, CodeFenced,
	CodeNotPrimary, CodeUnavailable, CodePermissionDenied, CodeInternal,
}

// Error is a typed error: a code from the fixed set and a message meant for
// the operator.
type Error struct {
	Code    Code
	Message string
	// RetryAfter, when positive, is a hint of when to try again: the node
	// is busy (a concurrency limit), not broken.
	RetryAfter time.Duration
	// Cause is kept for errors.Is/As (for example a refused connection
	// behind CodeUnavailable); it never goes on the wire.
	Cause error
}

func (e *Error) Error() string {
	return string(e.Code) + ": " + e.Message
}

// Coder is an error that knows its kind. A package's own error types
// (journal.FencedError, op.ErrTermOver) implement it rather than being
// translated into an *Error where they are returned: they compose with %w
// like any error, and CodeOf reads the kind at the edge (containerd's
// errdefs interfaces work this way).
type Coder interface {
	error
	ErrorCode() Code
}

// ErrorCode is the error's kind.
func (e *Error) ErrorCode() Code { return e.Code }

// Unwrap returns the cause of the error, if any.
func (e *Error) Unwrap() error { return e.Cause }

// Errorf returns an *Error with a formatted message. A %w verb keeps its
// operand as the cause.
func Errorf(code Code, format string, args ...any) *Error {
	err := fmt.Errorf(format, args...)
	return &Error{Code: code, Message: err.Error(), Cause: errors.Unwrap(err)}
}

// Busy is the unavailable error of a node at one of its concurrency limits:
// the caller should retry after the hint (at least one second).
func Busy(retryAfter time.Duration, format string, args ...any) *Error {
	e := Errorf(CodeUnavailable, format, args...)
	e.RetryAfter = max(retryAfter, time.Second)
	return e
}

// RetryAfterOf returns the retry hint of the first *Error in err's chain,
// or 0.
func RetryAfterOf(err error) time.Duration {
	var e *Error
	if errors.As(err, &e) {
		return e.RetryAfter
	}
	return 0
}

// CodeOf returns the code of the first Coder (an *Error, or a package's
// own kind of error) in err's chain, CodeInternal when there is none, and
// "" for a nil error.
func CodeOf(err error) Code {
	if err == nil {
		return ""
	}
	var c Coder
	if errors.As(err, &c) && c.ErrorCode() != "" {
		return c.ErrorCode()
	}
	return CodeInternal
}

// Is reports whether err's code (CodeOf) is code.
func Is(err error, code Code) bool { return err != nil && CodeOf(err) == code }

// Quote renders a rejected value for a message: escaped, and cut short so
// a 10 MiB ID does not make a 10 MiB log line.
func Quote(s string) string {
	const max = 80
	if len(s) <= max {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%q... (%d bytes)", s[:max], len(s))
}
