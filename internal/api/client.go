package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/names"
)

// DefaultSocketPath is where the primary serves the API.
const DefaultSocketPath = "/run/ctld/ctld.sock"

// HealthCheckHeader marks ctld's own periodic health-check requests, which
// are logged at debug level only.
const HealthCheckHeader = "X-Ctld-Health-Check"

// maxErrorBody bounds how much of an error response the client reads.
const maxErrorBody = 64 << 10

// Client calls the local API. Its zero value talks to DefaultSocketPath.
// Errors the server answered come back as *errdefs.Error with the server's code and
// message; a node that cannot be reached is an *errdefs.Error with errdefs.CodeUnavailable
// wrapping the dial error.
type Client struct {
	// SocketPath is the API socket; "" means DefaultSocketPath.
	SocketPath string
	// Dial, when set, replaces dialing SocketPath (tests, other
	// transports).
	Dial func(ctx context.Context) (net.Conn, error)
}

func (c *Client) socketPath() string {
	if c.SocketPath == "" {
		return DefaultSocketPath
	}
	return c.SocketPath
}

func (c *Client) dial(ctx context.Context) (net.Conn, error) {
	if c.Dial != nil {
		return c.Dial(ctx)
	}
	var d net.Dialer
	return d.DialContext(ctx, "unix", c.socketPath())
}

// do sends one request. A transport per call keeps the zero value usable
// and leaves no idle connection behind; the calls are few and local.
func (c *Client) do(ctx context.Context, method, path string, query url.Values, body io.Reader, header http.Header) (*http.Response, error) {
	return c.doSized(ctx, method, path, query, body, -1, header)
}

// doSized is do with the body's length when the caller knows it (-1: as
// net/http finds it).
func (c *Client) doSized(ctx context.Context, method, path string, query url.Values, body io.Reader, size int64, header http.Header) (*http.Response, error) {
	u := "http://ctld" + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, fmt.Errorf("build request %s %s: %w", method, path, err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if size >= 0 {
		req.ContentLength = size
		if size == 0 {
			req.Body = http.NoBody
		}
	}
	tr := &http.Transport{
		DialContext:       func(ctx context.Context, _, _ string) (net.Conn, error) { return c.dial(ctx) },
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	hc := &http.Client{
		Transport: tr,
		// The API never redirects; a redirect would turn a POST into a GET.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	resp, err := hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("call ctld %s %s: %w", method, path, err)
		}
		return nil, &errdefs.Error{Code: errdefs.CodeUnavailable, Message: fmt.Sprintf("call ctld at %s: %v", c.target(), err), Cause: err}
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}

func (c *Client) target() string {
	if c.Dial != nil {
		return "custom dialer"
	}
	return c.socketPath()
}

// decodeError turns an error response into *errdefs.Error, keeping the server's
// code and message, or making one from the status when the body is not an
// ErrorBody.
func decodeError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	// The body's hint wins; the header serves answers without one.
	var retry time.Duration
	if s, err := strconv.ParseInt(resp.Header.Get("Retry-After"), 10, 64); err == nil && s > 0 {
		retry = time.Duration(s) * time.Second
	}
	var eb ErrorBody
	if err := json.Unmarshal(b, &eb); err == nil && eb.Code != "" {
		if eb.RetryAfterSec > 0 {
			retry = time.Duration(eb.RetryAfterSec) * time.Second
		}
		return &errdefs.Error{Code: eb.Code, Message: eb.Message, RetryAfter: retry}
	}
	return &errdefs.Error{
		Code:       codeForStatus(resp.StatusCode),
		Message:    fmt.Sprintf("ctld answered %s: %s", resp.Status, strings.TrimSpace(string(b))),
		RetryAfter: retry,
	}
}

// call sends in as JSON (when not nil) and decodes the JSON answer into out.
func (c *Client) call(ctx context.Context, method, path string, in, out any) error {
	return c.callQuery(ctx, method, path, nil, in, out)
}

// callQuery is call with a query.
func (c *Client) callQuery(ctx context.Context, method, path string, query url.Values, in, out any) error {
	var body io.Reader
	h := http.Header{"Accept": {"application/json"}}
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		body = bytes.NewReader(b)
		h.Set("Content-Type", "application/json")
	}
	resp, err := c.do(ctx, method, path, query, body, h)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	// Unknown fields are accepted so an older client reads a newer server.
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode %s %s answer: %w", method, path, err)
	}
	return nil
}

// sandboxPath builds a route for sandbox id. The id is checked here too:
// an id like ".." cannot even be routed, and the server would refuse any
// invalid one with the same message.
func sandboxPath(id string, rest ...string) (string, error) {
	if err := names.CheckID("sandbox id", id); err != nil {
		return "", err
	}
	p := "/v1/sandboxes/" + url.PathEscape(id)
	for _, r := range rest {
		p += "/" + r
	}
	return p, nil
}

// Node returns the node's identity, role and capacity.
func (c *Client) Node(ctx context.Context) (Node, error) {
	var n Node
	return n, c.call(ctx, http.MethodGet, "/v1/node", nil, &n)
}

// Claim claims a runtime generation for sandbox id; it returns once the
// sandbox is ready.
func (c *Client) Claim(ctx context.Context, id string, r ClaimRequest) (ClaimResponse, error) {
	var out ClaimResponse
	p, err := sandboxPath(id, "claim")
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, http.MethodPost, p, r, &out)
}

// Exec runs a command and returns its whole output (capped by the server).
func (c *Client) Exec(ctx context.Context, id string, r ExecRequest) (ExecResult, error) {
	var out ExecResult
	p, err := sandboxPath(id, "exec")
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, http.MethodPost, p, r, &out)
}

// ExecStream runs a command, copying its output to stdout and stderr as it
// comes, and returns its exit code.
func (c *Client) ExecStream(ctx context.Context, id string, r ExecRequest, stdout, stderr io.Writer) (int, error) {
	return c.execStream(ctx, id, nil, r, stdout, stderr)
}

// ExecViaRunsc is ExecStream through `runsc exec` instead of the guest
// agent: the operator's fallback when the agent does not answer.
func (c *Client) ExecViaRunsc(ctx context.Context, id string, r ExecRequest, stdout, stderr io.Writer) (int, error) {
	return c.execStream(ctx, id, url.Values{"via": {ExecViaRunsc}}, r, stdout, stderr)
}

// ExecViaRunsc is the value of exec's "via" query parameter that runs the
// command through `runsc exec`.
const ExecViaRunsc = "runsc"

func (c *Client) execStream(ctx context.Context, id string, query url.Values, r ExecRequest, stdout, stderr io.Writer) (int, error) {
	p, err := sandboxPath(id, "exec")
	if err != nil {
		return -1, err
	}
	b, err := json.Marshal(r)
	if err != nil {
		return -1, fmt.Errorf("encode request: %w", err)
	}
	h := http.Header{"Accept": {ContentTypeSSE}, "Content-Type": {"application/json"}}
	resp, err := c.do(ctx, http.MethodPost, p, query, bytes.NewReader(b), h)
	if err != nil {
		return -1, err
	}
	defer resp.Body.Close()
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != ContentTypeSSE {
		return -1, &errdefs.Error{Code: errdefs.CodeInternal, Message: fmt.Sprintf("exec answered %q, want %s", mt, ContentTypeSSE)}
	}
	code, err := readExecStream(resp.Body, stdout, stderr)
	if err != nil && ctx.Err() != nil {
		return -1, fmt.Errorf("exec stream: %w", ctx.Err())
	}
	return code, err
}

// ReadFile returns the content of path inside the sandbox (ReadFileTo
// into memory).
func (c *Client) ReadFile(ctx context.Context, id, path string) ([]byte, error) {
	var b bytes.Buffer
	if _, err := c.ReadFileTo(ctx, id, path, nil, &b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// WriteFile writes data to path inside the sandbox.
func (c *Client) WriteFile(ctx context.Context, id, path string, data []byte) error {
	p, err := sandboxPath(id, "files")
	if err != nil {
		return err
	}
	h := http.Header{"Content-Type": {"application/octet-stream"}}
	resp, err := c.do(ctx, http.MethodPut, p, url.Values{"path": {path}}, bytes.NewReader(data), h)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// Release destroys the sandbox's generation and returns the cleanup proof.
func (c *Client) Release(ctx context.Context, id string, r ReleaseRequest) (ReleaseResponse, error) {
	var out ReleaseResponse
	p, err := sandboxPath(id, "release")
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, http.MethodPost, p, r, &out)
}

// UpdateNetwork replaces the network policy of the sandbox's running
// generation and returns the sandbox as it is after.
func (c *Client) UpdateNetwork(ctx context.Context, id string, p NetworkPolicy) (Sandbox, error) {
	var out Sandbox
	path, err := sandboxPath(id, "network")
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, http.MethodPost, path, p, &out)
}

// List returns the sandboxes the node knows.
func (c *Client) List(ctx context.Context) (SandboxList, error) {
	var out SandboxList
	return out, c.call(ctx, http.MethodGet, "/v1/sandboxes", nil, &out)
}

// Get returns one sandbox.
func (c *Client) Get(ctx context.Context, id string) (Sandbox, error) {
	var out Sandbox
	p, err := sandboxPath(id)
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, http.MethodGet, p, nil, &out)
}

// Proof returns the cleanup proof recorded for an operation.
func (c *Client) Proof(ctx context.Context, operationID string) (CleanupProof, error) {
	var out CleanupProof
	if err := ValidateOperationID(operationID); err != nil {
		return out, err
	}
	return out, c.call(ctx, http.MethodGet, "/v1/proofs/"+url.PathEscape(operationID), nil, &out)
}
