package apiserver

import (
	"net/http"
	"testing"

	"github.com/ctld/ctld/internal/errdefs"
)

func TestHTTPStatus(t *testing.T) {
	for code, want := range map[errdefs.Code]int{
		errdefs.CodeInvalidArgument:   http.StatusBadRequest,
		errdefs.CodeNotFound:          http.StatusNotFound,
		errdefs.CodeConflict:          http.StatusConflict,
		errdefs.CodeCapacityExhausted: http.StatusTooManyRequests,
		errdefs.CodeFenced:            http.StatusConflict,
		errdefs.CodeNotPrimary:        http.StatusServiceUnavailable,
		errdefs.CodeUnavailable:       http.StatusServiceUnavailable,
		errdefs.CodePermissionDenied:  http.StatusForbidden,
		errdefs.CodeInternal:          http.StatusInternalServerError,
		errdefs.Code("bogus"):         http.StatusInternalServerError,
	} {
		if got := HTTPStatus(code); got != want {
			t.Errorf("HTTPStatus(%q) = %d, want %d", code, got, want)
		}
	}
}

// Every code has a deliberate status: only internal (and unknown codes)
// is 500.
func TestHTTPStatusCoversEveryCode(t *testing.T) {
	for _, c := range errdefs.Codes {
		if got := HTTPStatus(c); got == http.StatusInternalServerError && c != errdefs.CodeInternal {
			t.Errorf("HTTPStatus(%q) = 500: the code has no mapping", c)
		}
	}
}
