package apiserver

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
)

type observed struct {
	mu  sync.Mutex
	got []string
}

func (o *observed) ObserveRequest(route string, status int, code errdefs.Code, d time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if d <= 0 {
		route += " (no duration)"
	}
	o.got = append(o.got, fmt.Sprintf("%q %d %q", route, status, code))
}

// TestObserverSeesEveryRequest: the Observer hears each request once,
// with the matched route pattern (not the path, so the label set stays
// bounded), the status and the error code; unknown routes and methods
// have their catch-all pattern.
func TestObserverSeesEveryRequest(t *testing.T) {
	obs := &observed{}
	fake := &fakeService{}
	srv := startServer(t, &Server{Service: fake, AllowedGID: -1, Observer: obs})
	rawDo(t, srv.sock, "GET", "/v1/node", nil, nil)
	rawDo(t, srv.sock, "GET", "/v1/sandboxes/sb-1", nil, nil)
	rawDo(t, srv.sock, "GET", "/v1/sandboxes/BAD", nil, nil)
	rawDo(t, srv.sock, "DELETE", "/v1/node", nil, nil)
	rawDo(t, srv.sock, "GET", "/nope", nil, nil)
	fake.err = errdefs.Errorf(errdefs.CodeNotFound, "gone")
	rawDo(t, srv.sock, "GET", "/v1/sandboxes/sb-2", nil, nil)
	obs.mu.Lock()
	defer obs.mu.Unlock()
	want := []string{
		`"GET /v1/node" 200 ""`,
		`"GET /v1/sandboxes/{id}" 200 ""`,
		`"GET /v1/sandboxes/{id}" 400 "invalid_argument"`,
		`"/v1/node" 405 "invalid_argument"`,
		`"/" 404 "not_found"`,
		`"GET /v1/sandboxes/{id}" 404 "not_found"`,
	}
	if !slices.Equal(obs.got, want) {
		t.Fatalf("observed\n%v\nwant\n%v", obs.got, want)
	}
}
