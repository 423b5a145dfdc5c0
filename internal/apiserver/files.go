package apiserver

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
)

// DefaultMaxStreamFileBytes is the default cap of a file streamed through
// the files routes (the guest agent's own default cap).
const DefaultMaxStreamFileBytes = 1 << 30

func (s *Server) maxStreamFile() int64 {
	if s.MaxStreamFileBytes <= 0 {
		return DefaultMaxStreamFileBytes
	}
	return s.MaxStreamFileBytes
}

// fileQuery checks a file route's query: only the named parameters, each
// at most once, exactly one absolute path, and uid and gid together.
func fileQuery(r *http.Request, allowed ...string) (string, *api.User, url.Values, error) {
	q := r.URL.Query()
	for k, v := range q {
		if !slices.Contains(allowed, k) {
			return "", nil, nil, invalid("unknown query parameter %s: want %v", errdefs.Quote(k), allowed)
		}
		if len(v) != 1 && k != "path" {
			return "", nil, nil, invalid("query parameter %s given %d times", k, len(v))
		}
	}
	p, err := filePath(r)
	if err != nil {
		return "", nil, nil, err
	}
	u, err := queryUser(q)
	return p, u, q, err
}

// queryUser reads uid and gid (both or neither: a half-named user would
// fall back to the workload's for the other half).
func queryUser(q url.Values) (*api.User, error) {
	us, hasUID := q["uid"]
	gs, hasGID := q["gid"]
	if !hasUID && !hasGID {
		return nil, nil
	}
	if hasUID != hasGID {
		return nil, invalid("uid and gid go together: give both or neither")
	}
	uid, err1 := strconv.ParseUint(us[0], 10, 32)
	gid, err2 := strconv.ParseUint(gs[0], 10, 32)
	if err1 != nil || err2 != nil {
		return nil, invalid("uid %s gid %s: want decimal ids", errdefs.Quote(us[0]), errdefs.Quote(gs[0]))
	}
	u := &api.User{UID: uint32(uid), GID: uint32(gid)}
	return u, api.ValidateUser(u)
}

// handleReadFile streams a file out: nothing is buffered beyond one write.
// The header goes out with the first byte, so a refusal (not found, too
// large) is still a JSON error; a failure after that cuts the connection
// so the caller sees a broken stream, never a short file that ends well.
func (s *Server) handleReadFile(w http.ResponseWriter, r *http.Request) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	p, u, _, err := fileQuery(r, "path", "uid", "gid")
	if err != nil {
		return err
	}
	release, err := acquireBoth(s.SandboxStreams, id, s.Streams)
	if err != nil {
		return err
	}
	defer release()
	limit := s.maxStreamFile()
	out := &lazyBody{w: w, limit: limit}
	n, err := s.Service.ReadFileTo(r.Context(), id, p, u, limit, out)
	if out.over {
		err = invalid("file exceeds %d bytes", limit)
	}
	if err != nil {
		if !out.started {
			return err
		}
		s.logger().Warn("file read broken mid-stream; cutting the connection", "sandbox", id, "path", p, "bytes", n, "err", err)
		// What went out goes out, so the caller sees a stream cut short
		// rather than no answer.
		_ = http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler)
	}
	out.start()
	return nil
}

// lazyBody sends the response header with the first byte and refuses
// bytes past limit (a Service that ignores its limit still cannot send
// more).
type lazyBody struct {
	mu      sync.Mutex
	w       http.ResponseWriter
	limit   int64
	n       int64
	started bool
	over    bool
}

func (b *lazyBody) start() {
	if b.started {
		return
	}
	b.started = true
	h := b.w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("X-Content-Type-Options", "nosniff")
	b.w.WriteHeader(http.StatusOK)
}

func (b *lazyBody) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.n+int64(len(p)) > b.limit {
		b.over = true
		return 0, invalid("file exceeds %d bytes", b.limit)
	}
	b.start()
	n, err := b.w.Write(p)
	b.n += int64(n)
	return n, err
}

// handleWriteFile streams the body into the file: the Service replaces the
// file only once the whole body arrived within the cap.
func (s *Server) handleWriteFile(w http.ResponseWriter, r *http.Request) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	p, u, q, err := fileQuery(r, "path", "uid", "gid", "mode")
	if err != nil {
		return err
	}
	var mode uint32
	if ms, ok := q["mode"]; ok {
		m, err := strconv.ParseUint(ms[0], 8, 32)
		if err != nil {
			return invalid("mode %s: want octal permission bits like 0644", errdefs.Quote(ms[0]))
		}
		if err := api.ValidateFileMode(uint32(m)); err != nil {
			return err
		}
		mode = uint32(m)
	}
	if ct := r.Header.Get("Content-Type"); ct != "" && ct != "application/octet-stream" {
		return &statusError{http.StatusUnsupportedMediaType, invalid("content-type %s not supported: send application/octet-stream", errdefs.Quote(ct))}
	}
	limit := s.maxStreamFile()
	if r.ContentLength > limit {
		return invalid("file exceeds %d bytes", limit)
	}
	release, err := acquireBoth(s.SandboxStreams, id, s.Streams)
	if err != nil {
		return err
	}
	defer release()
	body := &bodyReader{r: http.MaxBytesReader(w, r.Body, limit)}
	_, err = s.Service.WriteFileFrom(r.Context(), id, p, u, mode, limit, body)
	if body.err != nil {
		// The body's own failure is the cause, whatever the Service made
		// of it.
		var mbe *http.MaxBytesError
		if errors.As(body.err, &mbe) {
			return invalid("file exceeds %d bytes", limit)
		}
		return invalid("read request body: %v", body.err)
	}
	if err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// bodyReader remembers the request body's error (not its EOF).
type bodyReader struct {
	r   io.Reader
	err error
}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) && b.err == nil {
		b.err = err
	}
	return n, err
}

func (s *Server) handleStatFile(w http.ResponseWriter, r *http.Request) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	p, u, _, err := fileQuery(r, "path", "uid", "gid")
	if err != nil {
		return err
	}
	fi, err := s.Service.StatFile(r.Context(), id, p, u)
	return answer(w, fi, err)
}

func (s *Server) handleListDir(w http.ResponseWriter, r *http.Request) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	p, u, _, err := fileQuery(r, "path", "uid", "gid")
	if err != nil {
		return err
	}
	release, err := acquireBoth(s.SandboxStreams, id, s.Streams)
	if err != nil {
		return err
	}
	defer release()
	es, err := s.Service.ListDir(r.Context(), id, p, u)
	if err != nil {
		return err
	}
	writeListing(w, api.DirListing{Path: p, Entries: es})
	return nil
}

// writeListing sends l as writeJSON would, but encodes it an entry at a
// time through a small buffer: a listing may be the client's whole byte
// budget, and a second copy of it as one JSON value would double that.
// Chunked: the length is not known before the end.
func writeListing(w http.ResponseWriter, l api.DirListing) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(w, 32<<10)
	enc := json.NewEncoder(bw) // Encode adds a newline after each value: valid JSON whitespace
	bw.WriteString(`{"path":`)
	enc.Encode(l.Path)
	bw.WriteString(`,"entries":[`)
	for i, e := range l.Entries {
		if i > 0 {
			bw.WriteByte(',')
		}
		if enc.Encode(e) != nil {
			return // the client is gone (a FileInfo always encodes)
		}
	}
	bw.WriteString("]}\n")
	_ = bw.Flush() // the client is gone if this fails; nothing to tell it
}

func (s *Server) handleMakeDir(w http.ResponseWriter, r *http.Request) error {
	id, req, err := decodeFor[api.MkdirRequest](s, w, r)
	if err != nil {
		return err
	}
	return answer(w, struct{}{}, s.Service.MakeDir(r.Context(), id, req.Path, req.Mode, req.Parents, req.User))
}

func (s *Server) handleRemoveFile(w http.ResponseWriter, r *http.Request) error {
	id, req, err := decodeFor[api.RemoveRequest](s, w, r)
	if err != nil {
		return err
	}
	return answer(w, struct{}{}, s.Service.RemoveFile(r.Context(), id, req.Path, req.Recursive, req.User))
}

func (s *Server) handleRenameFile(w http.ResponseWriter, r *http.Request) error {
	id, req, err := decodeFor[api.RenameRequest](s, w, r)
	if err != nil {
		return err
	}
	return answer(w, struct{}{}, s.Service.RenameFile(r.Context(), id, req.From, req.To, req.User))
}

// execVia reads exec's "via" query parameter: "" (the guest agent) or
// api.ExecViaRunsc.
func execVia(r *http.Request) (string, error) {
	q := r.URL.Query()
	for k, v := range q {
		if k != "via" {
			return "", invalid("unknown query parameter %s: exec takes only via", errdefs.Quote(k))
		}
		if len(v) != 1 || v[0] != api.ExecViaRunsc {
			return "", invalid("via=%s: the only other way is via=%s", errdefs.Quote(fmt.Sprint(v)), api.ExecViaRunsc)
		}
	}
	return q.Get("via"), nil
}
