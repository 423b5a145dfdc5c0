package apiserver

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
)

func (s *Server) handleLogs(w http.ResponseWriter, r *http.Request) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	req, err := api.ParseLogsRequest(r.URL.Query())
	if err != nil {
		return err
	}
	if !req.Follow {
		buf := &tailBuffer{limit: int(s.maxFile())}
		if _, err := s.Service.Logs(r.Context(), id, req, buf); err != nil {
			return err
		}
		data := buf.buf
		h := w.Header()
		h.Set("Content-Type", "text/plain; charset=utf-8")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Content-Length", strconv.Itoa(len(data)))
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(data) // the client is gone if this fails
		return nil
	}
	release, err := acquireBoth(s.SandboxStreams, id, s.Streams)
	if err != nil {
		return err
	}
	defer release()
	sw := newSSEWriter(w)
	end, err := s.Service.Logs(r.Context(), id, req, sw.stream(api.EventLog))
	if err != nil && !sw.hasStarted() {
		return err
	}
	if err != nil {
		c := errdefs.CodeOf(err)
		if rec, ok := w.(*recorder); ok {
			rec.code = c
		}
		b, _ := json.Marshal(api.ErrorBody{Code: c, Message: wireMessage(err)})
		_ = sw.event(api.EventError, b)
		return nil
	}
	b, _ := json.Marshal(end)
	_ = sw.event(api.EventEnd, b)
	return nil
}

// tailBuffer keeps the last limit bytes written to it: of a log, the
// latest lines matter.
type tailBuffer struct {
	buf   []byte
	limit int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.limit; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}
