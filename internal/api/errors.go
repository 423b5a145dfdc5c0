package api

import (
	"net/http"

	"github.com/ctld/ctld/internal/errdefs"
)

// The kinds of error are package errdefs; this file maps them to HTTP at
// the socket (HTTPStatus, server side) and back (codeForStatus, client
// side, for responses without a usable ErrorBody).

// codeForStatus guesses a code for an error response without a usable
// ErrorBody (for example from a proxy or a panic recovery in net/http).
func codeForStatus(status int) errdefs.Code {
	switch status {
	case http.StatusBadRequest, http.StatusMethodNotAllowed, http.StatusUnsupportedMediaType, http.StatusRequestEntityTooLarge:
		return errdefs.CodeInvalidArgument
	case http.StatusNotFound:
		return errdefs.CodeNotFound
	case http.StatusConflict:
		return errdefs.CodeConflict
	case http.StatusTooManyRequests:
		return errdefs.CodeCapacityExhausted
	case http.StatusServiceUnavailable:
		return errdefs.CodeUnavailable
	case http.StatusForbidden, http.StatusUnauthorized:
		return errdefs.CodePermissionDenied
	default:
		return errdefs.CodeInternal
	}
}
