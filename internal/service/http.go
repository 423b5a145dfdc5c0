package service

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"hash"
	"io"
	"mime"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/manager"
)

// handlerFunc is a handler that returns its error; the router answers it.
type handlerFunc func(w http.ResponseWriter, r *http.Request, owner string) error

// route is one path's handlers by method.
type route struct {
	pattern string
	methods map[string]handlerFunc
}

func (s *Server) routes() []route {
	return []route{
		{"/v1/sandboxes", map[string]handlerFunc{http.MethodPost: s.create, http.MethodGet: s.list}},
		{"/v1/sandboxes/{id}", map[string]handlerFunc{http.MethodGet: s.get, http.MethodDelete: s.destroy}},
		{"/v1/sandboxes/{id}/exec", map[string]handlerFunc{http.MethodPost: s.active(s.exec)}},
		{"/v1/sandboxes/{id}/code", map[string]handlerFunc{http.MethodPost: s.active(s.code)}},
		{"/v1/sandboxes/{id}/files", map[string]handlerFunc{http.MethodGet: s.active(s.readFile), http.MethodPut: s.active(s.writeFile)}},
		{"/v1/sandboxes/{id}/files/list", map[string]handlerFunc{http.MethodGet: s.active(s.listFiles)}},
		{"/v1/sandboxes/{id}/files/stat", map[string]handlerFunc{http.MethodGet: s.active(s.statFile)}},
		{"/v1/sandboxes/{id}/files/mkdir", map[string]handlerFunc{http.MethodPost: s.active(s.mkdir)}},
		{"/v1/sandboxes/{id}/files/remove", map[string]handlerFunc{http.MethodPost: s.active(s.remove)}},
		{"/v1/sandboxes/{id}/files/move", map[string]handlerFunc{http.MethodPost: s.active(s.move)}},
		{"/v1/sandboxes/{id}/timeout", map[string]handlerFunc{http.MethodPost: s.setTimeout}},
		{"/v1/sandboxes/{id}/pause", map[string]handlerFunc{http.MethodPost: s.pause}},
		{"/v1/sandboxes/{id}/resume", map[string]handlerFunc{http.MethodPost: s.resume}},
		{"/v1/sandboxes/{id}/snapshots", map[string]handlerFunc{http.MethodPost: s.snapshot, http.MethodGet: s.listSnapshots}},
		{"/v1/sandboxes/{id}/restore", map[string]handlerFunc{http.MethodPost: s.restore}},
		{"/v1/sandboxes/{id}/fork", map[string]handlerFunc{http.MethodPost: s.fork}},
		{"/v1/sandboxes/{id}/network", map[string]handlerFunc{http.MethodPut: s.setNetwork}},
		{"/v1/volumes", map[string]handlerFunc{http.MethodPost: s.createVolume, http.MethodGet: s.listVolumes}},
		{"/v1/volumes/{id}", map[string]handlerFunc{http.MethodGet: s.getVolume, http.MethodDelete: s.deleteVolume}},
		{"/v1/templates", map[string]handlerFunc{http.MethodGet: s.templates}},
		{"/v1/events", map[string]handlerFunc{http.MethodGet: s.followEvents}},
		{"/v1/sandboxes/{id}/logs", map[string]handlerFunc{http.MethodGet: s.active(s.logs)}},
	}
}

// Handler is the API's HTTP handler.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	for _, rt := range s.routes() {
		mux.Handle(rt.pattern, s.endpoint(rt.methods))
	}
	mux.HandleFunc("/v1/openapi.json", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			s.writeError(w, r, errorf(client.CodeMethodNotAllowed, r.Method+" is not allowed here"))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(OpenAPI)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, errorf(client.CodeNotFound, "no such endpoint: "+r.URL.Path))
	})
	return s.logged(mux)
}

// endpoint authenticates the caller, then runs the method's handler
// (through the idempotency layer for mutating methods).
func (s *Server) endpoint(methods map[string]handlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		owner, err := s.authenticate(r)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		if lw, ok := w.(*logWriter); ok {
			lw.owner = owner
		}
		h, ok := methods[r.Method]
		if !ok {
			w.Header().Set("Allow", allowed(methods))
			s.writeError(w, r, errorf(client.CodeMethodNotAllowed, r.Method+" is not allowed on "+r.URL.Path))
			return
		}
		if r.Method != http.MethodGet && r.Header.Get("Idempotency-Key") != "" {
			err = s.idempotent(w, r, owner, h)
		} else {
			err = h(w, r, owner)
		}
		if err != nil {
			s.writeError(w, r, err)
		}
	})
}

func allowed(methods map[string]handlerFunc) string {
	var out []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete} {
		if _, ok := methods[m]; ok {
			out = append(out, m)
		}
	}
	return strings.Join(out, ", ")
}

// authenticate returns the owner of the request's bearer key. The key is
// never logged or echoed.
func (s *Server) authenticate(r *http.Request) (string, error) {
	h := r.Header.Get("Authorization")
	key, ok := strings.CutPrefix(h, "Bearer ")
	if !ok || key == "" {
		return "", manager.ErrUnauthenticated
	}
	return s.Store.Authenticate(r.Context(), strings.TrimSpace(key))
}

// logWriter records the status for the access log.
type logWriter struct {
	http.ResponseWriter
	status int
	owner  string
}

func (w *logWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *logWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *logWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// logged writes one access line per call: method, path, status, owner
// and duration; never a header (the key is in one) nor a body.
func (s *Server) logged(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		lw := &logWriter{ResponseWriter: w}
		next.ServeHTTP(lw, r)
		s.log().Info("api call", "method", r.Method, "path", r.URL.Path, "status", lw.status, "owner", lw.owner, "ms", time.Since(start).Milliseconds())
	})
}

// decodeJSON reads a JSON body of at most MaxBodyBytes into v: unknown
// fields and trailing data are refused.
func (s *Server) decodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || mt != "application/json" {
			return errorf(client.CodeUnsupportedMedia, "request body must be application/json")
		}
	}
	body := http.MaxBytesReader(w, r.Body, orDefault(s.MaxBodyBytes, DefaultMaxBodyBytes))
	s.bodyDeadline(w, orDefault(s.BodyTimeout, DefaultBodyTimeout))
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		var ne net.Error
		if errors.As(err, &mbe) {
			return err
		}
		if errors.As(err, &ne) && ne.Timeout() {
			return invalidf("request body did not arrive within %v", orDefault(s.BodyTimeout, DefaultBodyTimeout))
		}
		return errorf(client.CodeInvalidArgument, "decode request body: "+err.Error())
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errorf(client.CodeInvalidArgument, "request body has data after its JSON value")
	}
	return nil
}

// bodyDeadline bounds the time the rest of the request body may take; a
// connection past it is cut (the server's ReadTimeout cannot be used: it
// would also cut long uploads and streams).
func (s *Server) bodyDeadline(w http.ResponseWriter, d time.Duration) {
	if err := http.NewResponseController(w).SetReadDeadline(time.Now().Add(d)); err != nil {
		s.log().Warn("set body deadline", "err", err)
	}
}

// Idempotency-Key: the first call with a key runs and its answer is kept
// (statuses below 500, except 429); a retry with the same key and the
// same request (method, path, query and body, by SHA-256) gets that
// answer again; a different request is idempotency_mismatch; a retry
// while the first still runs is a conflict to retry. Answers that are
// not kept (5xx, 429) free the key for a new try.

const maxIdempotencyKey = 255

type hashingBody struct {
	io.ReadCloser
	h hash.Hash
}

func (b *hashingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.h.Write(p[:n])
	return n, err
}

// requestHash starts the hash of r: its method, path and query; the body
// is added as it is read.
func requestHash(r *http.Request) *hashingBody {
	h := sha256.New()
	h.Write([]byte(r.Method + "\n" + r.URL.Path + "\n" + r.URL.RawQuery + "\n"))
	return &hashingBody{ReadCloser: r.Body, h: h}
}

// drain reads the rest of the body into its hash, up to the largest body
// any endpoint accepts (what lies beyond was refused anyway).
func (s *Server) drain(b *hashingBody) string {
	io.CopyN(io.Discard, b, orDefault(s.MaxFileBytes, DefaultMaxFileBytes)+1)
	return hex.EncodeToString(b.h.Sum(nil))
}

// replayWriter keeps the answer while writing it.
type replayWriter struct {
	http.ResponseWriter
	status   int
	buf      bytes.Buffer
	limit    int64
	tooLarge bool
}

func (w *replayWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *replayWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if !w.tooLarge {
		if int64(w.buf.Len()+len(b)) > w.limit {
			w.tooLarge = true
			w.buf.Reset()
		} else {
			w.buf.Write(b)
		}
	}
	return w.ResponseWriter.Write(b)
}

func (w *replayWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (s *Server) idempotent(w http.ResponseWriter, r *http.Request, owner string, h handlerFunc) error {
	key := r.Header.Get("Idempotency-Key")
	if len(key) > maxIdempotencyKey || strings.ContainsFunc(key, func(c rune) bool { return c < 0x21 || c > 0x7e }) {
		return errorf(client.CodeInvalidArgument, "Idempotency-Key must be 1 to 255 printable ASCII characters")
	}
	ctx := context.WithoutCancel(r.Context())
	rec, created, err := s.Store.BeginIdempotent(ctx, owner, key)
	if err != nil {
		return err
	}
	body := requestHash(r)
	r.Body = body
	if !created {
		if rec.State == "pending" {
			w.Header().Set("Retry-After", "1")
			return errorf(client.CodeConflict, "a call with this Idempotency-Key is still running; retry later")
		}
		if s.drain(body) != rec.RequestHash {
			return errorf(client.CodeIdempotencyMismatch, "this Idempotency-Key was used for a different request")
		}
		if rec.Status == 0 {
			return errorf(client.CodeConflict, "the first answer to this Idempotency-Key was too large to keep; it cannot be replayed")
		}
		if rec.ContentType != "" {
			w.Header().Set("Content-Type", rec.ContentType)
		}
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(rec.Status)
		w.Write(rec.Body)
		return nil
	}
	// The call's lease: a replica that dies in it leaves the key to be
	// forgotten (or answered by the operation's taker), not pending for
	// ever (replica.go).
	callLease := manager.OpLease{ID: leaseCall + "/" + owner + "/" + key, Kind: leaseCall, Owner: owner, Holder: s.ReplicaID, IdemOwner: owner, IdemKey: key}
	if err := s.holdLease(ctx, callLease); err != nil {
		return errors.Join(err, s.Store.AbandonIdempotent(ctx, owner, key))
	}
	defer s.letGo(ctx, callLease.ID, true)
	call := &idemCall{owner: owner, key: key, body: body}
	defer call.finish(ctx, s)
	r = r.WithContext(context.WithValue(r.Context(), idemCtxKey{}, call))
	rw := &replayWriter{ResponseWriter: w, limit: orDefault(s.MaxReplayBytes, DefaultMaxReplayBytes)}
	if herr := h(rw, r, owner); herr != nil {
		s.writeError(rw, r, herr)
	}
	hashHex := s.drain(body)
	if rw.status >= 500 || rw.status == http.StatusTooManyRequests {
		call.mu.Lock()
		handedOff := call.handedOff
		call.mu.Unlock()
		if handedOff {
			return nil
		}
		// The answer is written: a store that fails here (the database
		// down) is logged, not answered twice; the sweeper forgets the
		// key once its call lease is gone.
		if err := s.Store.AbandonIdempotent(ctx, owner, key); err != nil {
			s.log().Warn("forget the Idempotency-Key of a failed call", "owner", owner, "err", err)
		}
		return nil
	}
	keep := manager.IdempotencyRecord{RequestHash: hashHex, Status: rw.status, ContentType: rw.Header().Get("Content-Type"), Body: rw.buf.Bytes()}
	if rw.tooLarge {
		keep.Status, keep.Body = 0, nil
	}
	if err := s.Store.FinishIdempotent(ctx, owner, key, keep); err != nil {
		s.log().Error("record idempotent answer", "owner", owner, "err", err)
	}
	return nil
}
