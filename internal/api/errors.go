package api

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Error is a typed API error: a code from the fixed set in types.go and a
// message meant for the operator. The server sends it as ErrorBody; the
// client returns the server's ErrorBody as *Error.
type Error struct {
	Code    Code
	Message string
	// RetryAfter, when positive, is the server's hint of when to try
	// again (ErrorBody.RetryAfterSec, the Retry-After header).
	RetryAfter time.Duration
	// cause is kept for errors.Is/As on the client side (for example a
	// refused connection behind CodeUnavailable); it never goes on the wire.
	cause error
}

func (e *Error) Error() string {
	return string(e.Code) + ": " + e.Message
}

// Unwrap returns the local cause of the error, if any.
func (e *Error) Unwrap() error { return e.cause }

// Errorf returns an *Error with a formatted message. A %w verb keeps its
// operand as the cause.
func Errorf(code Code, format string, args ...any) *Error {
	err := fmt.Errorf(format, args...)
	return &Error{Code: code, Message: err.Error(), cause: errors.Unwrap(err)}
}

// Busy is the unavailable error of a node at one of its concurrency limits:
// the caller should retry after the hint (rounded up to whole seconds on
// the wire, at least one).
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

// retryAfterSec rounds a hint up to whole seconds (the header's unit).
func retryAfterSec(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// CodeOf returns the code of the first *Error in err's chain, CodeInternal
// when there is none, and "" for a nil error.
func CodeOf(err error) Code {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) && e.Code != "" {
		return e.Code
	}
	return CodeInternal
}

// HTTPStatus maps a code to its HTTP status. Choices that are not obvious:
//   - capacity_exhausted is 429: the node is healthy but cannot take this
//     claim now; a caller may retry later or elsewhere, unlike a 503 which
//     says this endpoint itself is not serving.
//   - fenced is 409: the request acts with an epoch or writer identity that
//     has been superseded, a conflict with the current state that retrying
//     the same request cannot fix.
//   - not_primary and unavailable are 503: another instance (or a later
//     try) may serve it.
//
// An unknown code is 500.
func HTTPStatus(c Code) int {
	switch c {
	case CodeInvalidArgument:
		return http.StatusBadRequest
	case CodeNotFound:
		return http.StatusNotFound
	case CodeConflict, CodeFenced:
		return http.StatusConflict
	case CodeCapacityExhausted:
		return http.StatusTooManyRequests
	case CodeNotPrimary, CodeUnavailable:
		return http.StatusServiceUnavailable
	case CodePermissionDenied:
		return http.StatusForbidden
	default:
		return http.StatusInternalServerError
	}
}

// codeForStatus guesses a code for an error response without a usable
// ErrorBody (for example from a proxy or a panic recovery in net/http).
func codeForStatus(status int) Code {
	switch status {
	case http.StatusBadRequest, http.StatusMethodNotAllowed, http.StatusUnsupportedMediaType, http.StatusRequestEntityTooLarge:
		return CodeInvalidArgument
	case http.StatusNotFound:
		return CodeNotFound
	case http.StatusConflict:
		return CodeConflict
	case http.StatusTooManyRequests:
		return CodeCapacityExhausted
	case http.StatusServiceUnavailable:
		return CodeUnavailable
	case http.StatusForbidden, http.StatusUnauthorized:
		return CodePermissionDenied
	default:
		return CodeInternal
	}
}
