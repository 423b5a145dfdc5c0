package service

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/manager"
)

// apiError is an error of the service's own (bad request shapes, auth):
// a wire code and a message.
type apiError struct {
	code    string
	message string
}

func (e *apiError) Error() string { return e.code + ": " + e.message }

func errorf(code, msg string) error { return &apiError{code: code, message: msg} }

// statusOf is the one table of wire codes and their HTTP status.
var statusOf = map[string]int{
	client.CodeInvalidArgument:     http.StatusBadRequest,
	client.CodeUnauthenticated:     http.StatusUnauthorized,
	client.CodeNotFound:            http.StatusNotFound,
	client.CodeMethodNotAllowed:    http.StatusMethodNotAllowed,
	client.CodeConflict:            http.StatusConflict,
	client.CodePayloadTooLarge:     http.StatusRequestEntityTooLarge,
	client.CodeUnsupportedMedia:    http.StatusUnsupportedMediaType,
	client.CodeIdempotencyMismatch: http.StatusUnprocessableEntity,
	client.CodeQuotaExceeded:       http.StatusTooManyRequests,
	client.CodeInternal:            http.StatusInternalServerError,
	client.CodeUnavailable:         http.StatusServiceUnavailable,
	client.CodeTimeout:             http.StatusGatewayTimeout,
}

// codeOfKind maps the manager's (ctld's) error kinds to wire codes.
var codeOfKind = map[errdefs.Code]string{
	errdefs.CodeInvalidArgument:   client.CodeInvalidArgument,
	errdefs.CodeNotFound:          client.CodeNotFound,
	errdefs.CodeConflict:          client.CodeConflict,
	errdefs.CodeFenced:            client.CodeConflict,
	errdefs.CodeCapacityExhausted: client.CodeUnavailable,
	errdefs.CodeNotPrimary:        client.CodeUnavailable,
	errdefs.CodeUnavailable:       client.CodeUnavailable,
	errdefs.CodePermissionDenied:  client.CodeInternal,
	errdefs.CodeInternal:          client.CodeInternal,
}

// classify maps an error to its wire form. Internal errors keep their
// detail in the server's log, not on the wire.
func classify(err error) (code, msg string, retryAfter time.Duration) {
	var ae *apiError
	var qe *manager.QuotaError
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &ae):
		if ae.code == client.CodeUnavailable {
			retryAfter = time.Second
		}
		return ae.code, ae.message, retryAfter
	case errors.As(err, &qe):
		return client.CodeQuotaExceeded, qe.Error(), qe.RetryAfter
	case errors.As(err, &mbe):
		return client.CodePayloadTooLarge, "request body larger than " + strconv.FormatInt(mbe.Limit, 10) + " bytes", 0
	case errors.Is(err, manager.ErrUnauthenticated):
		return client.CodeUnauthenticated, "missing, unknown or revoked API key", 0
	case errors.Is(err, context.DeadlineExceeded):
		return client.CodeTimeout, "gave up waiting: " + err.Error(), 0
	}
	var ee *errdefs.Error
	if !errors.As(err, &ee) {
		return client.CodeInternal, "internal error (see the server's log)", 0
	}
	code = codeOfKind[ee.Code]
	if code == "" || code == client.CodeInternal {
		return client.CodeInternal, "internal error (see the server's log)", 0
	}
	retryAfter = ee.RetryAfter
	if code == client.CodeUnavailable && retryAfter <= 0 {
		retryAfter = time.Second
	}
	return code, ee.Message, retryAfter
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	_ = enc.Encode(v)
}

// writeError answers err in the one error shape.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	code, msg, retry := classify(err)
	status := statusOf[code]
	if code == client.CodeInternal {
		s.log().Error("internal error", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	if retry > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(int64((retry+time.Second-1)/time.Second), 10))
	}
	if code == client.CodeUnauthenticated {
		w.Header().Set("WWW-Authenticate", `Bearer realm="ctl-manager"`)
	}
	writeJSON(w, status, client.ErrorBody{Error: client.ErrorDetail{Code: code, Message: msg}})
}
