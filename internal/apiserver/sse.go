package apiserver

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/ctld/ctld/internal/api"
)

// sseChunk is the largest output chunk of one event, so one event
// line stays small for the reader whatever the Service writes at once.
const sseChunk = 32 << 10

// sseWriter writes events to an http.ResponseWriter. The Service may write
// stdout and stderr from two goroutines, so writes are serialized. The
// response header is sent with the first event, so an error before any
// output can still go out as a plain JSON error with its status.
type sseWriter struct {
	mu      sync.Mutex
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
	err     error // first write error: the client is gone
}

func newSSEWriter(w http.ResponseWriter) *sseWriter {
	return &sseWriter{w: w, rc: http.NewResponseController(w)}
}

func (s *sseWriter) start() {
	if s.started {
		return
	}
	s.started = true
	h := s.w.Header()
	h.Set("Content-Type", api.ContentTypeSSE)
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	s.w.WriteHeader(http.StatusOK)
}

// event writes one event and flushes it.
func (s *sseWriter) event(name string, data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	s.start()
	var b bytes.Buffer
	b.Grow(len(name) + len(data) + 16)
	b.WriteString("event: ")
	b.WriteString(name)
	b.WriteString("\ndata: ")
	b.Write(data)
	b.WriteString("\n\n")
	if _, err := s.w.Write(b.Bytes()); err != nil {
		s.err = fmt.Errorf("write event: %w", err)
		return s.err
	}
	if err := s.rc.Flush(); err != nil {
		s.err = fmt.Errorf("flush event: %w", err)
	}
	return s.err
}

// hasStarted reports whether the stream header went out.
func (s *sseWriter) hasStarted() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.started
}

// stream returns an io.Writer that sends what is written to it as events
// named name, in base64 chunks of at most sseChunk bytes.
func (s *sseWriter) stream(name string) io.Writer {
	return sseStream{s: s, name: name}
}

type sseStream struct {
	s    *sseWriter
	name string
}

func (o sseStream) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		c := p[:min(len(p), sseChunk)]
		if err := o.s.event(o.name, []byte(base64.StdEncoding.EncodeToString(c))); err != nil {
			return n, err
		}
		n += len(c)
		p = p[len(c):]
	}
	return n, nil
}
