package apiserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/logging"
	"github.com/ctld/ctld/internal/names"
	"golang.org/x/sys/unix"
)

// Defaults of Server.
const (
	DefaultMaxBodyBytes  = 1 << 20
	DefaultMaxFileBytes  = 8 << 20
	DefaultShutdownGrace = 30 * time.Second
)

// Server serves a Service over HTTP/1.1 + JSON. It validates every ID and
// body before the Service sees it, and admits only peers whose SO_PEERCRED
// says uid 0, or whose primary or supplementary groups (SO_PEERGROUPS)
// include AllowedGID.
type Server struct {
	Service Service
	Logger  *slog.Logger
	// AllowedGID is the ctld group; -1 admits root only. A peer is in it
	// by its effective gid (SO_PEERCRED) or a supplementary group
	// (SO_PEERGROUPS), as the kernel recorded them at connect time.
	AllowedGID int
	// MaxBodyBytes caps a JSON request body (default 1 MiB).
	MaxBodyBytes int64
	// MaxFileBytes caps each output stream of a JSON exec result and a
	// logs answer, which are held in memory (default 8 MiB).
	MaxFileBytes int64
	// MaxStreamFileBytes caps a file read or written through the files
	// routes, which stream it (default 1 GiB).
	MaxStreamFileBytes int64
	// ShutdownGrace is how long Serve lets requests in flight finish after
	// its context is done (default 30 s); then connections are closed.
	ShutdownGrace time.Duration
	// Claims and Execs bound the claims and execs running at once (nil:
	// no bound). Beyond them a request is answered unavailable with a
	// retry hint at once, before it reaches the Service.
	Claims, Execs *Limiter
	// SandboxExecs bounds the execs and sessions running at once in one
	// sandbox (nil: no bound), refused as Execs is.
	SandboxExecs *KeyedLimiter
	// Streams and SandboxStreams bound the streams open at once on the
	// node and per sandbox (nil: no bound): log follows, file reads and
	// writes, directory listings (each up to the agent client's byte
	// budget in memory). Refused as Execs is.
	Streams        *Limiter
	SandboxStreams *KeyedLimiter
	// Observer, if set, is told of every request once it is answered
	// (metrics); nil: nobody is.
	Observer RequestObserver
	// Usage serves GET /v1/usage (usage.go); nil: unavailable.
	Usage UsageService
}

// RequestObserver sees each request once answered: route is the matched
// pattern ("POST /v1/sandboxes/{id}/claim"; "" when none matched, as for a
// refused peer), status the HTTP status, code the error code of an error
// answer ("" for a success) and d how long the whole request took.
type RequestObserver interface {
	ObserveRequest(route string, status int, code errdefs.Code, d time.Duration)
}

// PeerCred is the identity of the process at the other end of the socket.
type PeerCred struct {
	PID int32
	UID uint32
	GID uint32
	// Groups are the peer's supplementary groups.
	Groups []uint32
}

type peerKey struct{}

type peerInfo struct {
	cred PeerCred
	err  error
}

// PeerFromContext returns the credentials of the peer of a request served
// by Serve.
func PeerFromContext(ctx context.Context) (PeerCred, bool) {
	p, ok := ctx.Value(peerKey{}).(peerInfo)
	if !ok || p.err != nil {
		return PeerCred{}, false
	}
	return p.cred, true
}

// readPeer reads SO_PEERCRED once per connection: the kernel records the
// credentials at connect time, so they cannot change under the connection.
func readPeer(c net.Conn) peerInfo {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return peerInfo{err: fmt.Errorf("read peer credentials: %T is not a socket", c)}
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return peerInfo{err: fmt.Errorf("read peer credentials: %w", err)}
	}
	var cred *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return peerInfo{err: fmt.Errorf("read peer credentials: %w", err)}
	}
	if serr != nil {
		return peerInfo{err: fmt.Errorf("read peer credentials: %w", serr)}
	}
	var groups []uint32
	if err := raw.Control(func(fd uintptr) { groups, serr = peerGroups(int(fd)) }); err != nil {
		return peerInfo{err: fmt.Errorf("read peer groups: %w", err)}
	}
	if serr != nil {
		return peerInfo{err: fmt.Errorf("read peer groups: %w", serr)}
	}
	return peerInfo{cred: PeerCred{PID: cred.Pid, UID: cred.Uid, GID: cred.Gid, Groups: groups}}
}

// peerGroups reads SO_PEERGROUPS (Linux 4.13+): the supplementary groups the
// kernel recorded with the peer's credentials at connect time. Unlike
// /proc/<pid>/status it cannot be read from a reused pid. x/sys has no
// getter for it, hence the raw getsockopt.
func peerGroups(fd int) ([]uint32, error) {
	buf := make([]uint32, 64)
	for range 2 {
		n := uint32(len(buf) * 4)
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_PEERGROUPS,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
		switch {
		case errno == unix.ERANGE:
			// The kernel wrote the size it needs into n.
			buf = make([]uint32, n/4+1)
		case errno != 0:
			return nil, fmt.Errorf("getsockopt SO_PEERGROUPS: %w", errno)
		default:
			return slices.Clone(buf[:n/4]), nil
		}
	}
	return nil, errors.New("getsockopt SO_PEERGROUPS: group list keeps growing")
}

func (s *Server) logger() *slog.Logger {
	return logging.OrDiscard(s.Logger)
}

func (s *Server) maxBody() int64 {
	if s.MaxBodyBytes <= 0 {
		return DefaultMaxBodyBytes
	}
	return s.MaxBodyBytes
}

func (s *Server) maxFile() int64 {
	if s.MaxFileBytes <= 0 {
		return DefaultMaxFileBytes
	}
	return s.MaxFileBytes
}

func (s *Server) admits(c PeerCred) bool {
	if c.UID == 0 {
		return true
	}
	if s.AllowedGID < 0 {
		return false
	}
	return c.GID == uint32(s.AllowedGID) || slices.Contains(c.Groups, uint32(s.AllowedGID))
}

// Serve serves the API on ln until ctx is done, then shuts down gracefully:
// requests in flight get ShutdownGrace to finish. It returns nil after a
// shutdown asked for by ctx.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	log := s.logger()
	// Streams without an end of their own (log follows) watch this.
	shutdown := make(chan struct{})
	hs := &http.Server{
		Handler: s.Handler(),
		// Requests keep ctx's values but not its cancellation, so a
		// shutdown lets a claim in flight finish instead of tearing it
		// down halfway.
		BaseContext: func(net.Listener) context.Context {
			return api.WithShutdown(context.WithoutCancel(ctx), shutdown)
		},
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, peerKey{}, readPeer(c))
		},
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	hs.RegisterOnShutdown(func() { close(shutdown) })
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve api: %w", err)
	case <-ctx.Done():
	}
	grace := s.ShutdownGrace
	if grace <= 0 {
		grace = DefaultShutdownGrace
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	var err error
	if serr := hs.Shutdown(sctx); serr != nil {
		err = errors.Join(fmt.Errorf("shut down api server: %w", serr), hs.Close())
	}
	<-errc // http.ErrServerClosed once Shutdown or Close ran
	return err
}

// apiFunc is a route handler; an error it returns is written as api.ErrorBody
// with the status of its code.
type apiFunc func(w http.ResponseWriter, r *http.Request) error

// Handler returns the API's routes under /v1, behind the peer check and
// the request log. Without Serve there are no peer credentials and every
// request is refused.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	methods := map[string][]string{}
	var paths []string
	route := func(method, path string, h apiFunc) {
		if _, ok := methods[path]; !ok {
			paths = append(paths, path)
		}
		methods[path] = append(methods[path], method)
		mux.Handle(method+" "+path, s.adapt(h))
	}
	route(http.MethodGet, "/v1/node", s.handleNode)
	route(http.MethodGet, "/v1/sandboxes", s.handleList)
	route(http.MethodGet, "/v1/sandboxes/{id}", s.handleGet)
	route(http.MethodPost, "/v1/sandboxes/{id}/claim", s.handleClaim)
	route(http.MethodPost, "/v1/sandboxes/{id}/exec", s.handleExec)
	route(http.MethodGet, "/v1/sandboxes/{id}/files", s.handleReadFile)
	route(http.MethodPut, "/v1/sandboxes/{id}/files", s.handleWriteFile)
	route(http.MethodGet, "/v1/sandboxes/{id}/files/stat", s.handleStatFile)
	route(http.MethodGet, "/v1/sandboxes/{id}/files/list", s.handleListDir)
	route(http.MethodPost, "/v1/sandboxes/{id}/files/mkdir", s.handleMakeDir)
	route(http.MethodPost, "/v1/sandboxes/{id}/files/remove", s.handleRemoveFile)
	route(http.MethodPost, "/v1/sandboxes/{id}/files/rename", s.handleRenameFile)
	route(http.MethodPost, "/v1/sandboxes/{id}/session", s.handleSession)
	route(http.MethodPost, "/v1/sandboxes/{id}/release", s.handleRelease)
	route(http.MethodPost, "/v1/sandboxes/{id}/network", s.handleNetwork)
	route(http.MethodGet, "/v1/sandboxes/{id}/logs", s.handleLogs)
	route(http.MethodPost, "/v1/sandboxes/{id}/pause", s.handlePause)
	route(http.MethodPost, "/v1/sandboxes/{id}/snapshot", s.handleSnapshot)
	route(http.MethodGet, "/v1/sandboxes/{id}/volume", s.handleVolume)
	route(http.MethodPost, "/v1/sandboxes/{id}/fork", s.handleFork)
	route(http.MethodPost, "/v1/sandboxes/{id}/restore", s.handleRestore)
	route(http.MethodGet, "/v1/proofs/{operation_id}", s.handleProof)
	route(http.MethodGet, "/v1/usage", s.handleUsage)
	// A pattern without a method is less specific than the routes above,
	// so it catches exactly the other methods on the same path; ServeMux's
	// own 405 would not be in the JSON error shape.
	for _, p := range paths {
		allow := strings.Join(methods[p], ", ")
		if strings.Contains(allow, http.MethodGet) {
			allow += ", " + http.MethodHead
		}
		mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", allow)
			writeError(w, http.StatusMethodNotAllowed, errdefs.CodeInvalidArgument,
				fmt.Sprintf("method %s not allowed on %s: use %s", r.Method, p, allow))
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, errdefs.CodeNotFound, fmt.Sprintf("no route %s %s", r.Method, r.URL.EscapedPath()))
	})
	return s.guard(mux)
}

// recorder remembers what a handler answered, for the request log.
type recorder struct {
	http.ResponseWriter
	status int
	code   errdefs.Code
}

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
	r.ResponseWriter.WriteHeader(status)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection to flush.
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// guard checks the peer, logs every request and turns a panic in the
// Service into a 500 instead of a dropped connection.
func (s *Server) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &recorder{ResponseWriter: w}
		peer, _ := r.Context().Value(peerKey{}).(peerInfo)
		if peer.err == nil && r.Context().Value(peerKey{}) == nil {
			peer.err = errors.New("no peer credentials: not served by Server.Serve")
		}
		log := s.logger()
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				log.Error("api handler panic", "method", r.Method, "path", r.URL.EscapedPath(),
					"panic", fmt.Sprint(p), "stack", string(debug.Stack()))
				if rec.status == 0 {
					writeError(rec, http.StatusInternalServerError, errdefs.CodeInternal, fmt.Sprintf("internal error: %v", p))
				}
			}
			attrs := []slog.Attr{
				slog.String("method", r.Method),
				slog.String("path", r.URL.EscapedPath()),
				slog.Int("status", rec.status),
				slog.Duration("duration", time.Since(start)),
			}
			if rec.code != "" {
				attrs = append(attrs, slog.String("code", string(rec.code)))
			}
			if peer.err == nil {
				attrs = append(attrs, slog.Int64("peer_uid", int64(peer.cred.UID)))
			}
			level := slog.LevelInfo
			if rec.status >= 500 {
				level = slog.LevelWarn
			} else if r.Header.Get(api.HealthCheckHeader) != "" {
				level = slog.LevelDebug // ctld's own health check, every few seconds
			}
			log.LogAttrs(r.Context(), level, "api request", attrs...)
			if s.Observer != nil {
				// r.Pattern is set by the mux on this same request.
				s.Observer.ObserveRequest(r.Pattern, rec.status, rec.code, time.Since(start))
			}
		}()
		if peer.err != nil {
			log.Warn("api peer refused", "reason", peer.err.Error())
			writeError(rec, http.StatusForbidden, errdefs.CodePermissionDenied, "peer credentials unknown: connect over the ctld Unix socket")
			return
		}
		if c := peer.cred; !s.admits(c) {
			log.Warn("api peer refused", "peer_uid", c.UID, "peer_gid", c.GID, "peer_pid", c.PID, "peer_groups", fmt.Sprint(c.Groups), "allowed_gid", s.AllowedGID)
			writeError(rec, http.StatusForbidden, errdefs.CodePermissionDenied,
				fmt.Sprintf("peer uid %d gid %d is neither root nor in the ctld group", c.UID, c.GID))
			return
		}
		next.ServeHTTP(rec, r)
	})
}

func (s *Server) adapt(h apiFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			answerError(w, err)
		}
	})
}

// answerError writes err as an ErrorBody with the status of its code.
func answerError(w http.ResponseWriter, err error) {
	code := errdefs.CodeOf(err)
	var se *statusError
	status := HTTPStatus(code)
	if errors.As(err, &se) {
		status = se.status
	}
	body := api.ErrorBody{Code: code, Message: wireMessage(err), RetryAfterSec: retryAfterSec(errdefs.RetryAfterOf(err))}
	writeErrorBody(w, status, body)
}

// statusError is an *errdefs.Error that needs a status other than its code's
// (405, 415).
type statusError struct {
	status int
	err    *errdefs.Error
}

func (e *statusError) Error() string { return e.err.Error() }
func (e *statusError) Unwrap() error { return e.err }

// wireMessage is the message sent for err: the bare message of an *errdefs.Error,
// or the whole chain when the *errdefs.Error is wrapped in context.
func wireMessage(err error) string {
	var se *statusError
	if errors.As(err, &se) {
		return se.err.Message
	}
	if e, ok := err.(*errdefs.Error); ok {
		return e.Message
	}
	return err.Error()
}

func writeError(w http.ResponseWriter, status int, code errdefs.Code, msg string) {
	writeErrorBody(w, status, api.ErrorBody{Code: code, Message: msg})
}

// writeErrorBody sends an error; a retry hint also goes in the standard
// Retry-After header (seconds), for clients that know nothing of ctld.
func writeErrorBody(w http.ResponseWriter, status int, body api.ErrorBody) {
	if rec, ok := w.(*recorder); ok {
		rec.code = body.Code
	}
	if body.RetryAfterSec > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(body.RetryAfterSec, 10))
	}
	writeJSON(w, status, body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b, _ = json.Marshal(api.ErrorBody{Code: errdefs.CodeInternal, Message: "encode response: " + err.Error()})
	}
	b = append(b, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	// A length, so the answer is whole once flushed, before the handler
	// returns (a session's error waits for its caller to end its body).
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b) // the client is gone if this fails; nothing to tell it
}

// decodeJSON reads exactly one JSON value into v, refusing unknown fields,
// bodies over MaxBodyBytes and anything after the value.
func (s *Server) decodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			return &statusError{http.StatusUnsupportedMediaType,
				invalid("content-type %s not supported: send application/json", errdefs.Quote(ct))}
		}
	}
	limit := s.maxBody()
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return bodyError(err, limit)
	}
	var extra json.RawMessage
	switch err := dec.Decode(&extra); {
	case errors.Is(err, io.EOF):
		return nil
	case err == nil:
		return invalid("request body has data after the JSON object: send exactly one JSON value")
	default:
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return bodyError(err, limit)
		}
		return invalid("request body has data after the JSON object: send exactly one JSON value")
	}
}

func bodyError(err error, limit int64) error {
	var (
		mbe *http.MaxBytesError
		se  *json.SyntaxError
		ute *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &mbe):
		return invalid("request body exceeds %d bytes", limit)
	case errors.Is(err, io.EOF):
		return invalid("request body is empty: want a JSON object")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return invalid("request body is truncated JSON")
	case errors.As(err, &se):
		return invalid("request body is not valid JSON at offset %d: %v", se.Offset, se)
	case errors.As(err, &ute):
		if ute.Field == "" {
			return invalid("request body is JSON %s: want an object", ute.Value)
		}
		return invalid("request body field %q: JSON %s cannot be %s", ute.Field, ute.Value, ute.Type)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return invalid("request body has unknown field %s", strings.TrimPrefix(err.Error(), "json: unknown field "))
	default:
		return invalid("decode request body: %v", err)
	}
}

func pathID(r *http.Request) (string, error) {
	id := r.PathValue("id")
	return id, names.CheckID("sandbox id", id)
}

func (s *Server) handleNode(w http.ResponseWriter, r *http.Request) error {
	n, err := s.Service.Node(r.Context())
	return answer(w, n, err)
}

func (s *Server) handleList(w http.ResponseWriter, r *http.Request) error {
	l, err := s.Service.List(r.Context())
	if err != nil {
		return err
	}
	if l.Sandboxes == nil {
		l.Sandboxes = []api.Sandbox{}
	}
	writeJSON(w, http.StatusOK, l)
	return nil
}

func (s *Server) handleGet(w http.ResponseWriter, r *http.Request) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	sb, err := s.Service.Get(r.Context(), id)
	return answer(w, sb, err)
}

// decodeFor decodes and validates the body of a mutating call on sandbox
// {id}; nothing reaches the Service unless both pass.
func decodeFor[Req interface{ Validate() error }](s *Server, w http.ResponseWriter, r *http.Request) (string, Req, error) {
	var req Req
	id, err := pathID(r)
	if err != nil {
		return id, req, err
	}
	if err := s.decodeJSON(w, r, &req); err != nil {
		return id, req, err
	}
	return id, req, req.Validate()
}

// answer writes a Service result, or returns its error for the adapter.
func answer[T any](w http.ResponseWriter, v T, err error) error {
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, v)
	return nil
}

func (s *Server) handleClaim(w http.ResponseWriter, r *http.Request) error {
	id, req, err := decodeFor[api.ClaimRequest](s, w, r)
	if err != nil {
		return err
	}
	if err := names.CheckGeneration(id, req.Generation); err != nil {
		return err
	}
	done, err := s.Claims.Acquire()
	if err != nil {
		return err
	}
	defer done()
	resp, err := s.Service.Claim(r.Context(), id, req)
	return answer(w, resp, err)
}

func (s *Server) handleRelease(w http.ResponseWriter, r *http.Request) error {
	id, req, err := decodeFor[api.ReleaseRequest](s, w, r)
	if err != nil {
		return err
	}
	resp, err := s.Service.Release(r.Context(), id, req)
	return answer(w, resp, err)
}

// handleNetwork replaces a running sandbox's network policy (a live
// update). It carries no operation_id: setting the same policy twice is
// the same update.
func (s *Server) handleNetwork(w http.ResponseWriter, r *http.Request) error {
	id, p, err := decodeFor[api.NetworkPolicy](s, w, r)
	if err != nil {
		return err
	}
	sb, err := s.Service.UpdateNetwork(r.Context(), id, p)
	return answer(w, sb, err)
}

func (s *Server) handleProof(w http.ResponseWriter, r *http.Request) error {
	op := r.PathValue("operation_id")
	if err := api.ValidateOperationID(op); err != nil {
		return err
	}
	p, err := s.Service.Proof(r.Context(), op)
	return answer(w, p, err)
}

// wantsEventStream reports whether the client asked for text/event-stream;
// loosely, as clients send lists with parameters.
func wantsEventStream(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), api.ContentTypeSSE)
}

func (s *Server) handleExec(w http.ResponseWriter, r *http.Request) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	via, err := execVia(r)
	if err != nil {
		return err
	}
	var req api.ExecRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		return err
	}
	if err := req.Validate(); err != nil {
		return err
	}
	if req.TTY || req.Rows != 0 || req.Cols != 0 {
		return invalid("tty, rows and cols need a session (POST /v1/sandboxes/{id}/session)")
	}
	exec := s.Service.Exec
	if via == api.ExecViaRunsc {
		exec = s.Service.ExecViaRunsc
	}
	done, err := acquireBoth(s.SandboxExecs, id, s.Execs)
	if err != nil {
		return err
	}
	// The slot is returned when the command ends, before the answer goes
	// out: a caller that heard the end may run its next exec at once.
	defer done()
	if wantsEventStream(r) {
		return s.execStream(w, r, exec, id, req, done)
	}
	limit := s.maxFile()
	stdout, stderr := &cappedBuffer{limit: limit}, &cappedBuffer{limit: limit}
	code, err := exec(r.Context(), id, req, stdout, stderr)
	done()
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, api.ExecResult{
		ExitCode:        code,
		Stdout:          stdout.bytes(),
		Stderr:          stderr.bytes(),
		StdoutTruncated: stdout.truncated(),
		StderrTruncated: stderr.truncated(),
	})
	return nil
}

// execFunc is Service.Exec or Service.ExecViaRunsc.
type execFunc func(ctx context.Context, id string, req api.ExecRequest, stdout, stderr io.Writer) (int, error)

// execStream runs the exec as an event stream; done returns its slot.
func (s *Server) execStream(w http.ResponseWriter, r *http.Request, exec execFunc, id string, req api.ExecRequest, done func()) error {
	sw := newSSEWriter(w)
	code, err := exec(r.Context(), id, req, sw.stream(api.EventStdout), sw.stream(api.EventStderr))
	done()
	if err != nil && !sw.hasStarted() {
		// Nothing went out yet: answer with the error's own status.
		return err
	}
	if err != nil {
		c := errdefs.CodeOf(err)
		if rec, ok := w.(*recorder); ok {
			rec.code = c
		}
		b, _ := json.Marshal(api.ErrorBody{Code: c, Message: wireMessage(err), RetryAfterSec: retryAfterSec(errdefs.RetryAfterOf(err))})
		_ = sw.event(api.EventError, b) // the client may be gone; the log has it
		return nil
	}
	b, _ := json.Marshal(api.ExecExit{ExitCode: code})
	_ = sw.event(api.EventExit, b)
	return nil
}

// cappedBuffer keeps the first limit bytes written to it and counts the
// rest, so a chatty command cannot grow a JSON exec answer without bound.
// It never fails a write: the command runs to its end either way.
type cappedBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	limit   int64
	dropped int64
}

func (c *cappedBuffer) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	room := c.limit - int64(c.buf.Len())
	keep := min(int64(len(p)), max(room, 0))
	c.buf.Write(p[:keep])
	c.dropped += int64(len(p)) - keep
	return len(p), nil
}

func (c *cappedBuffer) bytes() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.buf.Bytes())
}

func (c *cappedBuffer) truncated() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dropped > 0
}

func filePath(r *http.Request) (string, error) {
	ps, ok := r.URL.Query()["path"]
	if !ok || len(ps) != 1 {
		return "", invalid("need exactly one path query parameter, got %d", len(ps))
	}
	return ps[0], api.ValidateFilePath(ps[0])
}
