package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Client calls the service. BaseURL is like "http://127.0.0.1:8080"; Key
// is the API key ("ctl_..."); HTTP is the transport (nil:
// http.DefaultClient).
type Client struct {
	BaseURL string
	Key     string
	HTTP    *http.Client
}

// Option changes one request.
type Option func(*http.Request)

// IdempotencyKey makes a mutating call retryable: a retry with the same
// key and request gets the first answer.
func IdempotencyKey(k string) Option {
	return func(r *http.Request) { r.Header.Set("Idempotency-Key", k) }
}

func (c *Client) httpClient() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return http.DefaultClient
}

// Do sends a request to path (with query) and returns the response of a
// 2xx answer; any other answer is an *Error.
func (c *Client) Do(ctx context.Context, method, path string, query url.Values, body io.Reader, contentType string, opts ...Option) (*http.Response, error) {
	u := strings.TrimRight(c.BaseURL, "/") + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	if c.Key != "" {
		req.Header.Set("Authorization", "Bearer "+c.Key)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for _, o := range opts {
		o(req)
	}
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	return nil, readError(resp)
}

func readError(resp *http.Response) error {
	e := &Error{Status: resp.StatusCode, Code: CodeInternal}
	var b ErrorBody
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err := json.Unmarshal(raw, &b); err != nil || b.Error.Code == "" {
		e.Message = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(raw))
	} else {
		e.Code, e.Message = b.Error.Code, b.Error.Message
	}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
		e.RetryAfter = time.Duration(s) * time.Second
	}
	return e
}

func (c *Client) call(ctx context.Context, method, path string, query url.Values, in, out any, opts ...Option) error {
	var body io.Reader
	ct := ""
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		body, ct = bytes.NewReader(b), "application/json"
	}
	resp, err := c.Do(ctx, method, path, query, body, ct, opts...)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		return err
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode answer of %s %s: %w", method, path, err)
	}
	return nil
}

func sandboxPath(id string, rest ...string) string {
	return "/v1/sandboxes/" + url.PathEscape(id) + strings.Join(rest, "")
}

// Create creates a sandbox and waits until it is ready.
func (c *Client) Create(ctx context.Context, r CreateRequest, opts ...Option) (Sandbox, error) {
	var sb Sandbox
	err := c.call(ctx, http.MethodPost, "/v1/sandboxes", nil, r, &sb, opts...)
	return sb, err
}

// CreateNoWait creates a sandbox and returns at once (state creating).
func (c *Client) CreateNoWait(ctx context.Context, r CreateRequest, opts ...Option) (Sandbox, error) {
	var sb Sandbox
	err := c.call(ctx, http.MethodPost, "/v1/sandboxes", url.Values{"wait": {"false"}}, r, &sb, opts...)
	return sb, err
}

// Get returns a sandbox.
func (c *Client) Get(ctx context.Context, id string) (Sandbox, error) {
	var sb Sandbox
	err := c.call(ctx, http.MethodGet, sandboxPath(id), nil, nil, &sb)
	return sb, err
}

// CreateVolume creates a persistent volume of the caller's.
func (c *Client) CreateVolume(ctx context.Context, r VolumeCreateRequest, opts ...Option) (Volume, error) {
	var v Volume
	err := c.call(ctx, http.MethodPost, "/v1/volumes", nil, r, &v, opts...)
	return v, err
}

// Volume returns one of the caller's volumes.
func (c *Client) Volume(ctx context.Context, id string) (Volume, error) {
	var v Volume
	err := c.call(ctx, http.MethodGet, "/v1/volumes/"+url.PathEscape(id), nil, nil, &v)
	return v, err
}

// Volumes returns one page of the caller's volumes (cursor "" for the
// first).
func (c *Client) Volumes(ctx context.Context, limit int, cursor string) (VolumeList, error) {
	q := url.Values{}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	var l VolumeList
	err := c.call(ctx, http.MethodGet, "/v1/volumes", q, nil, &l)
	return l, err
}

// DeleteVolume deletes a volume no sandbox holds.
func (c *Client) DeleteVolume(ctx context.Context, id string, opts ...Option) (Volume, error) {
	var v Volume
	err := c.call(ctx, http.MethodDelete, "/v1/volumes/"+url.PathEscape(id), nil, nil, &v, opts...)
	return v, err
}

// ListOptions filter and page GET /v1/sandboxes.
type ListOptions struct {
	State  string
	Labels map[string]string
	Limit  int
	Cursor string
}

// List returns one page of the caller's sandboxes.
func (c *Client) List(ctx context.Context, o ListOptions) (SandboxList, error) {
	q := url.Values{}
	if o.State != "" {
		q.Set("state", o.State)
	}
	for k, v := range o.Labels {
		q.Add("label", k+"="+v)
	}
	if o.Limit > 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	if o.Cursor != "" {
		q.Set("cursor", o.Cursor)
	}
	var l SandboxList
	err := c.call(ctx, http.MethodGet, "/v1/sandboxes", q, nil, &l)
	return l, err
}

// Destroy destroys a sandbox and returns its verified cleanup proof.
func (c *Client) Destroy(ctx context.Context, id string, opts ...Option) (DestroyResult, error) {
	var r DestroyResult
	err := c.call(ctx, http.MethodDelete, sandboxPath(id), nil, nil, &r, opts...)
	return r, err
}

// Exec runs a command and returns its whole (capped) output.
func (c *Client) Exec(ctx context.Context, id string, r ExecRequest, opts ...Option) (ExecResult, error) {
	var res ExecResult
	err := c.call(ctx, http.MethodPost, sandboxPath(id, "/exec"), nil, r, &res, opts...)
	return res, err
}

// ExecStream runs a command, streaming its output to stdout and stderr as
// it comes, and returns its exit code.
func (c *Client) ExecStream(ctx context.Context, id string, r ExecRequest, stdout, stderr io.Writer, opts ...Option) (int, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return 0, fmt.Errorf("encode request: %w", err)
	}
	opts = append(opts, func(r *http.Request) { r.Header.Set("Accept", "text/event-stream") })
	resp, err := c.Do(ctx, http.MethodPost, sandboxPath(id, "/exec"), nil, bytes.NewReader(b), "application/json", opts...)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	return ReadExecEvents(resp.Body, stdout, stderr)
}

// ReadExecEvents reads an exec event stream until its exit or error event.
func ReadExecEvents(r io.Reader, stdout, stderr io.Writer) (int, error) {
	code := 0
	ended, err := readSSE(r, 4<<20, func(ev sseEvent) (bool, error) {
		switch ev.Name {
		case EventStdout, EventStderr:
			chunk, err := base64.StdEncoding.DecodeString(string(ev.Data))
			if err != nil {
				return false, fmt.Errorf("decode %s event: %w", ev.Name, err)
			}
			w := stdout
			if ev.Name == EventStderr {
				w = stderr
			}
			if w != nil {
				if _, err := w.Write(chunk); err != nil {
					return false, err
				}
			}
		case EventExit:
			var x ExecExit
			if err := json.Unmarshal(ev.Data, &x); err != nil {
				return false, fmt.Errorf("decode exit event: %w", err)
			}
			code = x.ExitCode
			return true, nil
		case EventError:
			return false, errorEvent(ev.Data)
		}
		return false, nil
	})
	if err != nil {
		return 0, err
	}
	if !ended {
		return 0, errors.New("exec stream ended without an exit event")
	}
	return code, nil
}

// sseEvent is one server-sent event.
type sseEvent struct {
	Name string
	ID   string
	Data []byte
}

// readSSE calls fn with each event of the stream r (lines of at most
// maxLine bytes) until fn returns true or an error, or the stream ends
// (ended false).
func readSSE(r io.Reader, maxLine int, fn func(sseEvent) (bool, error)) (ended bool, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4<<10), maxLine)
	var ev sseEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event:"):
			ev.Name = strings.TrimSpace(line[len("event:"):])
		case strings.HasPrefix(line, "id:"):
			ev.ID = strings.TrimSpace(line[len("id:"):])
		case strings.HasPrefix(line, "data:"):
			ev.Data = append(ev.Data, strings.TrimSpace(line[len("data:"):])...)
		case line == "" && ev.Name != "":
			if done, err := fn(ev); done || err != nil {
				return done, err
			}
			ev = sseEvent{}
		}
	}
	if err := sc.Err(); err != nil {
		return false, fmt.Errorf("read event stream: %w", err)
	}
	return false, nil
}

// errorEvent is the *Error an "error" event carries.
func errorEvent(data []byte) error {
	var b ErrorBody
	if err := json.Unmarshal(data, &b); err != nil {
		return fmt.Errorf("decode error event: %w", err)
	}
	return &Error{Status: http.StatusOK, Code: b.Error.Code, Message: b.Error.Message}
}

// ReadFile copies a guest file to w.
func (c *Client) ReadFile(ctx context.Context, id, path string, w io.Writer) (int64, error) {
	resp, err := c.Do(ctx, http.MethodGet, sandboxPath(id, "/files"), url.Values{"path": {path}}, nil, "")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	return io.Copy(w, resp.Body)
}

// WriteFile writes size bytes from r to a guest file.
func (c *Client) WriteFile(ctx context.Context, id, path string, r io.Reader, size int64, opts ...Option) error {
	opts = append(opts, func(req *http.Request) { req.ContentLength = size })
	resp, err := c.Do(ctx, http.MethodPut, sandboxPath(id, "/files"), url.Values{"path": {path}}, r, "application/octet-stream", opts...)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// ListFiles lists a guest directory.
func (c *Client) ListFiles(ctx context.Context, id, path string) ([]FileInfo, error) {
	var l FileList
	err := c.call(ctx, http.MethodGet, sandboxPath(id, "/files/list"), url.Values{"path": {path}}, nil, &l)
	return l.Entries, err
}

// Stat returns a guest file's information.
func (c *Client) Stat(ctx context.Context, id, path string) (FileInfo, error) {
	var fi FileInfo
	err := c.call(ctx, http.MethodGet, sandboxPath(id, "/files/stat"), url.Values{"path": {path}}, nil, &fi)
	return fi, err
}

// Mkdir makes a guest directory.
func (c *Client) Mkdir(ctx context.Context, id string, r MkdirRequest, opts ...Option) error {
	return c.call(ctx, http.MethodPost, sandboxPath(id, "/files/mkdir"), nil, r, nil, opts...)
}

// Remove removes a guest file or directory.
func (c *Client) Remove(ctx context.Context, id string, r RemoveRequest, opts ...Option) error {
	return c.call(ctx, http.MethodPost, sandboxPath(id, "/files/remove"), nil, r, nil, opts...)
}

// Move renames a guest file.
func (c *Client) Move(ctx context.Context, id string, r MoveRequest, opts ...Option) error {
	return c.call(ctx, http.MethodPost, sandboxPath(id, "/files/move"), nil, r, nil, opts...)
}

// SetTimeout makes the sandbox end timeoutSec from now.
func (c *Client) SetTimeout(ctx context.Context, id string, timeoutSec int64, opts ...Option) (Sandbox, error) {
	var sb Sandbox
	err := c.call(ctx, http.MethodPost, sandboxPath(id, "/timeout"), nil, TimeoutRequest{TimeoutSec: timeoutSec}, &sb, opts...)
	return sb, err
}

// Pause publishes a block sandbox's root and stops it.
func (c *Client) Pause(ctx context.Context, id string, opts ...Option) (Sandbox, error) {
	var sb Sandbox
	err := c.call(ctx, http.MethodPost, sandboxPath(id, "/pause"), nil, nil, &sb, opts...)
	return sb, err
}

// Resume starts a paused sandbox again from its published root.
func (c *Client) Resume(ctx context.Context, id string, opts ...Option) (Sandbox, error) {
	var sb Sandbox
	err := c.call(ctx, http.MethodPost, sandboxPath(id, "/resume"), nil, nil, &sb, opts...)
	return sb, err
}

// Snapshot seals a running block-mode sandbox's files under name.
func (c *Client) Snapshot(ctx context.Context, id, name string, opts ...Option) (Snapshot, error) {
	var out Snapshot
	err := c.call(ctx, http.MethodPost, sandboxPath(id, "/snapshots"), nil, SnapshotRequest{Name: name}, &out, opts...)
	return out, err
}

// Snapshots lists a block-mode sandbox's snapshots.
func (c *Client) Snapshots(ctx context.Context, id string) ([]Snapshot, error) {
	var out SnapshotList
	err := c.call(ctx, http.MethodGet, sandboxPath(id, "/snapshots"), nil, nil, &out)
	return out.Snapshots, err
}

// Restore moves a paused sandbox's files to its snapshot; Resume runs it
// from there.
func (c *Client) Restore(ctx context.Context, id, snapshot string, opts ...Option) (Sandbox, error) {
	var sb Sandbox
	err := c.call(ctx, http.MethodPost, sandboxPath(id, "/restore"), nil, RestoreRequest{Snapshot: snapshot}, &sb, opts...)
	return sb, err
}

// Fork creates a new sandbox from the source's snapshot (or last head)
// and waits until it is ready.
func (c *Client) Fork(ctx context.Context, id string, r ForkRequest, opts ...Option) (Sandbox, error) {
	var sb Sandbox
	err := c.call(ctx, http.MethodPost, sandboxPath(id, "/fork"), nil, r, &sb, opts...)
	return sb, err
}

// Templates lists the templates sandboxes can be created from.
func (c *Client) Templates(ctx context.Context) ([]Template, error) {
	var l TemplateList
	err := c.call(ctx, http.MethodGet, "/v1/templates", nil, nil, &l)
	return l.Templates, err
}

// OpenAPI returns the service's OpenAPI document.
func (c *Client) OpenAPI(ctx context.Context) ([]byte, error) {
	resp, err := c.Do(ctx, http.MethodGet, "/v1/openapi.json", nil, nil, "")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(io.LimitReader(resp.Body, 4<<20))
}

// UpdateNetwork replaces a running sandbox's egress policy.
func (c *Client) UpdateNetwork(ctx context.Context, id string, n Network, opts ...Option) (Network, error) {
	var out Network
	err := c.call(ctx, http.MethodPut, sandboxPath(id, "/network"), nil, n, &out, opts...)
	return out, err
}

// Events follows the caller's sandbox events (sandbox: only that one's;
// "" for all) and calls fn with each until fn returns an error, ctx ends
// or the stream does. A stream cut for falling behind ends with an *Error.
func (c *Client) Events(ctx context.Context, sandbox string, fn func(Event) error) error {
	return c.EventsAfter(ctx, sandbox, -1, fn)
}

// EventsAfter is Events that first replays the journaled events after the
// cursor after (an Event's Seq; 0: all kept; -1: none), so a follower
// resumes where it stopped, across restarts of the server.
func (c *Client) EventsAfter(ctx context.Context, sandbox string, after int64, fn func(Event) error) error {
	q := url.Values{}
	if sandbox != "" {
		q.Set("sandbox", sandbox)
	}
	if after >= 0 {
		q.Set("after", strconv.FormatInt(after, 10))
	}
	resp, err := c.Do(ctx, http.MethodGet, "/v1/events", q, nil, "", func(r *http.Request) { r.Header.Set("Accept", "text/event-stream") })
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = readSSE(resp.Body, 1<<20, func(e sseEvent) (bool, error) {
		if e.Name == EventError {
			return false, errorEvent(e.Data)
		}
		var ev Event
		if err := json.Unmarshal(e.Data, &ev); err != nil {
			return false, fmt.Errorf("decode %s event: %w", e.Name, err)
		}
		return false, fn(ev)
	})
	if err != nil && ctx.Err() == nil {
		return err
	}
	return ctx.Err()
}

// LogsOptions shape GET .../logs.
type LogsOptions struct {
	Tail    int   // last lines only (0: all)
	Follow  bool  // stream new output until the end
	IdleSec int64 // a follow ends after this long without output (0: the server's default)
}

// Logs copies the sandbox's main-process output to w and returns why it
// ended.
func (c *Client) Logs(ctx context.Context, id string, o LogsOptions, w io.Writer) (string, error) {
	q := url.Values{}
	if o.Tail > 0 {
		q.Set("tail", strconv.Itoa(o.Tail))
	}
	if o.IdleSec > 0 {
		q.Set("idle_sec", strconv.FormatInt(o.IdleSec, 10))
	}
	if !o.Follow {
		var r LogsResult
		if err := c.call(ctx, http.MethodGet, sandboxPath(id, "/logs"), q, nil, &r); err != nil {
			return "", err
		}
		_, err := w.Write(r.Log)
		return r.Reason, err
	}
	q.Set("follow", "true")
	resp, err := c.Do(ctx, http.MethodGet, sandboxPath(id, "/logs"), q, nil, "", func(r *http.Request) { r.Header.Set("Accept", "text/event-stream") })
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var reason string
	ended, err := readSSE(resp.Body, 4<<20, func(ev sseEvent) (bool, error) {
		switch ev.Name {
		case EventLog:
			b, err := base64.StdEncoding.DecodeString(string(ev.Data))
			if err != nil {
				return false, fmt.Errorf("decode log event: %w", err)
			}
			_, err = w.Write(b)
			return false, err
		case EventEnd:
			var end LogsEnd
			err := json.Unmarshal(ev.Data, &end)
			reason = end.Reason
			return true, err
		case EventError:
			return false, errorEvent(ev.Data)
		}
		return false, nil
	})
	if err != nil {
		return "", err
	}
	if !ended {
		return "", errors.New("log stream ended without an end event")
	}
	return reason, nil
}
