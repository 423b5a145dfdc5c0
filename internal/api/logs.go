package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"

	"github.com/ctld/ctld/internal/errdefs"
)

// LogSource is which log of a generation GET /v1/sandboxes/{id}/logs reads.
type LogSource string

// Log sources of GET /v1/sandboxes/{id}/logs.
const (
	LogSourceInit  LogSource = "init"  // the guest's init stdout and stderr
	LogSourceRunsc LogSource = "runsc" // runsc's own log for the generation
)

// Bounds of a logs request.
const (
	DefaultLogIdleSec = 300
	MaxLogIdleSec     = 3600
	MaxLogTailLines   = 1 << 20
)

// LogsRequest is the query of GET /v1/sandboxes/{id}/logs:
// source=init|runsc, tail=N (last N lines; 0 = all the log holds),
// follow=1 (stream new output as it comes, as text/event-stream), and
// idle_sec=N (a follow ends after N seconds without output; default 300).
type LogsRequest struct {
	Source  LogSource
	Tail    int
	Follow  bool
	IdleSec int64
}

// Log stream events (follow=1):
//
//	event: log    data: base64 of a chunk of the log
//	event: end    data: LogsEnd JSON, the last event
//	event: error  data: ErrorBody JSON, the last event
const (
	EventLog = "log"
	EventEnd = "end"
)

// LogsEnd says why a log read or follow ended and what it waited for.
type LogsEnd struct {
	Generation uint64 `json:"generation"`
	Reason     string `json:"reason"`
}

// Validate checks a logs request and fills its defaults.
func (r *LogsRequest) Validate() error {
	switch r.Source {
	case "":
		r.Source = LogSourceInit
	case LogSourceInit, LogSourceRunsc:
	default:
		return invalid("source must be %s or %s, got %s", LogSourceInit, LogSourceRunsc, errdefs.Quote(string(r.Source)))
	}
	if r.Tail < 0 || r.Tail > MaxLogTailLines {
		return invalid("tail must be between 0 (all) and %d lines, got %d", MaxLogTailLines, r.Tail)
	}
	if r.IdleSec < 0 || r.IdleSec > MaxLogIdleSec {
		return invalid("idle_sec must be between 0 (default %d) and %d, got %d", DefaultLogIdleSec, MaxLogIdleSec, r.IdleSec)
	}
	if r.IdleSec == 0 {
		r.IdleSec = DefaultLogIdleSec
	}
	return nil
}

// Query is the request as the query of GET /v1/sandboxes/{id}/logs.
func (r LogsRequest) Query() url.Values {
	q := url.Values{}
	if r.Source != "" {
		q.Set("source", string(r.Source))
	}
	if r.Tail > 0 {
		q.Set("tail", strconv.Itoa(r.Tail))
	}
	if r.Follow {
		q.Set("follow", "1")
	}
	if r.IdleSec > 0 {
		q.Set("idle_sec", strconv.FormatInt(r.IdleSec, 10))
	}
	return q
}

// ParseLogsRequest reads a logs request from its query (the server side of
// Query) and validates it.
func ParseLogsRequest(q url.Values) (LogsRequest, error) {
	var r LogsRequest
	for k, v := range q {
		if len(v) != 1 {
			return r, invalid("query parameter %s given %d times", errdefs.Quote(k), len(v))
		}
		var err error
		switch k {
		case "source":
			r.Source = LogSource(v[0])
		case "tail":
			r.Tail, err = strconv.Atoi(v[0])
		case "follow":
			r.Follow, err = strconv.ParseBool(v[0])
		case "idle_sec":
			r.IdleSec, err = strconv.ParseInt(v[0], 10, 64)
		default:
			return r, invalid("unknown query parameter %s: use source, tail, follow, idle_sec", errdefs.Quote(k))
		}
		if err != nil {
			return r, invalid("query parameter %s=%s: not a number or boolean", k, errdefs.Quote(v[0]))
		}
	}
	return r, r.Validate()
}

// shutdownKey carries a channel closed when the server begins to shut
// down, so endless streams (log follows) end instead of holding the
// graceful shutdown for its whole grace.
type shutdownKey struct{}

// WithShutdown returns ctx carrying shutdown, a channel the server closes
// when it begins to shut down.
func WithShutdown(ctx context.Context, shutdown <-chan struct{}) context.Context {
	return context.WithValue(ctx, shutdownKey{}, shutdown)
}

// ShuttingDown returns a channel closed once the server serving ctx began
// shutting down (nil, never closed, outside Serve).
func ShuttingDown(ctx context.Context) <-chan struct{} {
	ch, _ := ctx.Value(shutdownKey{}).(<-chan struct{})
	return ch
}

// Logs copies the sandbox's log to w: what it holds now, and with
// r.Follow what is written after, until the generation ends, nothing came
// for r.IdleSec, or the node hands over. The answer says which.
func (c *Client) Logs(ctx context.Context, id string, r LogsRequest, w io.Writer) (LogsEnd, error) {
	p, err := sandboxPath(id, "logs")
	if err != nil {
		return LogsEnd{}, err
	}
	if err := r.Validate(); err != nil {
		return LogsEnd{}, err
	}
	h := http.Header{"Accept": {"text/plain"}}
	if r.Follow {
		h.Set("Accept", ContentTypeSSE)
	}
	resp, err := c.do(ctx, http.MethodGet, p, r.Query(), nil, h)
	if err != nil {
		return LogsEnd{}, err
	}
	defer resp.Body.Close()
	if !r.Follow {
		if _, err := io.Copy(w, resp.Body); err != nil {
			return LogsEnd{}, fmt.Errorf("read logs of %s: %w", id, err)
		}
		return LogsEnd{Reason: "end of log"}, nil
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != ContentTypeSSE {
		return LogsEnd{}, &errdefs.Error{Code: errdefs.CodeInternal, Message: fmt.Sprintf("logs answered %q, want %s", mt, ContentTypeSSE)}
	}
	end, err := readLogStream(resp.Body, w)
	if err != nil && ctx.Err() != nil {
		return end, fmt.Errorf("follow logs of %s: %w", id, ctx.Err())
	}
	return end, err
}

// readLogStream copies log events to w until the end or error event.
func readLogStream(r io.Reader, w io.Writer) (LogsEnd, error) {
	var end LogsEnd
	err := readEvents(r, "log", "an end event", func(name string, data []byte) (bool, error) {
		switch name {
		case EventLog:
			_, _, err := dispatchEvent(EventStdout, data, w, nil)
			return false, err
		case EventEnd:
			if err := json.Unmarshal(data, &end); err != nil {
				return true, &errdefs.Error{Code: errdefs.CodeInternal, Message: "decode end event: " + err.Error(), Cause: err}
			}
			return true, nil
		case EventError:
			_, _, err := dispatchEvent(EventError, data, nil, nil)
			return true, err
		}
		return false, nil // unknown events are skipped
	})
	return end, err
}
