package apiserver

import (
	"net/http"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
)

// retryAfterSec rounds a hint up to whole seconds (the header's unit).
func retryAfterSec(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
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
func HTTPStatus(c errdefs.Code) int {
	switch c {
	case errdefs.CodeInvalidArgument:
		return http.StatusBadRequest
	case errdefs.CodeNotFound:
		return http.StatusNotFound
	case errdefs.CodeConflict, errdefs.CodeFenced:
		return http.StatusConflict
	case errdefs.CodeCapacityExhausted:
		return http.StatusTooManyRequests
	case errdefs.CodeNotPrimary, errdefs.CodeUnavailable:
		return http.StatusServiceUnavailable
	case errdefs.CodePermissionDenied:
		return http.StatusForbidden
	default:
		return http.StatusInternalServerError
	}
}

func invalid(format string, args ...any) *errdefs.Error {
	return errdefs.Errorf(errdefs.CodeInvalidArgument, format, args...)
}
