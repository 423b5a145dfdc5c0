package apiserver

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"net/http"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
)

// TestFileCallsRoundTrip: each file call of the client reaches the Service
// with its path, user, mode and flags, and its answer comes back.
func TestFileCallsRoundTrip(t *testing.T) {
	fake := &fakeService{file: []byte("content")}
	fake.stat = api.FileInfo{Name: "a", Size: 3, Mode: 0o640, UID: 1000}
	fake.entries = []api.FileInfo{{Name: "x", Mode: uint32(fs.ModeDir | 0o755)}, {Name: "y", Size: 1}}
	srv := startServer(t, &Server{Service: fake, AllowedGID: -1})
	c := &api.Client{SocketPath: srv.sock}
	ctx := context.Background()
	u := &api.User{UID: 1000, GID: 100}
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	fi, err := c.StatFile(ctx, "sb-1", "/a", u)
	must("stat", err)
	if fi != fake.stat {
		t.Errorf("stat = %+v", fi)
	}
	es, err := c.ListDir(ctx, "sb-1", "/d", nil)
	must("list", err)
	if !reflect.DeepEqual(es, fake.entries) {
		t.Errorf("list = %+v", es)
	}
	must("mkdir", c.MakeDir(ctx, "sb-1", "/d/e", 0o700, true, u))
	must("remove", c.RemoveFile(ctx, "sb-1", "/d", true, nil))
	must("rename", c.RenameFile(ctx, "sb-1", "/a", "/b", u))
	var got bytes.Buffer
	n, err := c.ReadFileTo(ctx, "sb-1", "/a", u, &got)
	must("read", err)
	if n != 7 || got.String() != "content" {
		t.Errorf("read = %d %q", n, got.String())
	}
	must("write", c.WriteFileFrom(ctx, "sb-1", "/w", u, 0o600, strings.NewReader("payload"), 7))
	must("write of unknown size", c.WriteFileFrom(ctx, "sb-1", "/w2", nil, 0, io.MultiReader(strings.NewReader("pay"), strings.NewReader("load")), -1))
	if string(fake.written) != "payload" {
		t.Errorf("written = %q", fake.written)
	}
	want := []string{
		"StatFile sb-1 /a 1000:100",
		"ListDir sb-1 /d default",
		"MakeDir sb-1 /d/e 0700 parents=true 1000:100",
		"RemoveFile sb-1 /d recursive=true default",
		"RenameFile sb-1 /a /b 1000:100",
		"ReadFileTo sb-1 /a 1000:100 limit=1073741824",
		"WriteFileFrom sb-1 /w 1000:100 0600 limit=1073741824",
		"WriteFileFrom sb-1 /w2 default 0 limit=1073741824",
	}
	if calls := fake.Calls(); !reflect.DeepEqual(calls, want) {
		t.Errorf("calls:\n%q\nwant\n%q", calls, want)
	}
}

// TestFileBadInputNeverReachesService: malformed file calls get a clear
// 400 and change nothing.
func TestFileBadInputNeverReachesService(t *testing.T) {
	fake := &fakeService{}
	srv := startServer(t, &Server{Service: fake, AllowedGID: -1, MaxStreamFileBytes: 16})
	jsonCT := map[string]string{"Content-Type": "application/json"}
	cases := []struct {
		name, method, target string
		header               map[string]string
		body                 string
		status               int
		msg                  string
	}{
		{"unknown query", "GET", "/v1/sandboxes/sb-1/files/stat?path=/a&follow=1", nil, "", 400, `unknown query parameter "follow"`},
		{"uid without gid", "GET", "/v1/sandboxes/sb-1/files/list?path=/a&uid=1000", nil, "", 400, "uid and gid go together"},
		{"uid not a number", "GET", "/v1/sandboxes/sb-1/files?path=/a&uid=root&gid=0", nil, "", 400, "want decimal ids"},
		{"uid -1", "GET", "/v1/sandboxes/sb-1/files?path=/a&uid=4294967295&gid=0", nil, "", 400, "not a user"},
		{"two uids", "GET", "/v1/sandboxes/sb-1/files/stat?path=/a&uid=1&uid=2&gid=0", nil, "", 400, "given 2 times"},
		{"relative path", "GET", "/v1/sandboxes/sb-1/files/list?path=etc", nil, "", 400, "must be absolute"},
		{"no path", "GET", "/v1/sandboxes/sb-1/files/stat", nil, "", 400, "path query parameter"},
		{"mode not octal", "PUT", "/v1/sandboxes/sb-1/files?path=/a&mode=rw", nil, "x", 400, "want octal"},
		{"mode setuid", "PUT", "/v1/sandboxes/sb-1/files?path=/a&mode=4755", nil, "x", 400, "want permission bits"},
		{"write over cap", "PUT", "/v1/sandboxes/sb-1/files?path=/a", nil, strings.Repeat("x", 17), 400, "file exceeds 16 bytes"},
		{"write json", "PUT", "/v1/sandboxes/sb-1/files?path=/a", jsonCT, "{}", 415, "octet-stream"},
		{"mkdir mode", "POST", "/v1/sandboxes/sb-1/files/mkdir", jsonCT, `{"path":"/d","mode":4095}`, 400, "want permission bits"},
		{"mkdir unknown field", "POST", "/v1/sandboxes/sb-1/files/mkdir", jsonCT, `{"path":"/d","owner":1}`, 400, `unknown field "owner"`},
		{"remove root", "POST", "/v1/sandboxes/sb-1/files/remove", jsonCT, `{"path":"/a/..","recursive":true}`, 400, "refusing to remove the guest's root"},
		{"remove relative", "POST", "/v1/sandboxes/sb-1/files/remove", jsonCT, `{"path":"a"}`, 400, "must be absolute"},
		{"rename onto root", "POST", "/v1/sandboxes/sb-1/files/rename", jsonCT, `{"from":"/a","to":"/"}`, 400, "refusing to rename"},
		{"rename no to", "POST", "/v1/sandboxes/sb-1/files/rename", jsonCT, `{"from":"/a"}`, 400, "empty"},
		{"stat by PUT", "PUT", "/v1/sandboxes/sb-1/files/stat?path=/a", nil, "", 405, "use GET"},
		{"exec via other", "POST", "/v1/sandboxes/sb-1/exec?via=docker", jsonCT, `{"args":["true"]}`, 400, "via=runsc"},
		{"exec unknown query", "POST", "/v1/sandboxes/sb-1/exec?tty=1", jsonCT, `{"args":["true"]}`, 400, "exec takes only via"},
		{"exec json tty", "POST", "/v1/sandboxes/sb-1/exec", jsonCT, `{"args":["true"],"tty":true}`, 400, "need a session"},
	}
	for _, c := range cases {
		resp := rawDo(t, srv.sock, c.method, c.target, c.header, []byte(c.body))
		var eb api.ErrorBody
		if err := json.Unmarshal(resp.body, &eb); err != nil || resp.status != c.status || eb.Code != errdefs.CodeInvalidArgument || !strings.Contains(eb.Message, c.msg) {
			t.Errorf("%s: %d %s, want %d invalid_argument containing %q", c.name, resp.status, resp.body, c.status, c.msg)
		}
	}
	if calls := fake.Calls(); len(calls) != 0 {
		t.Errorf("the Service saw %q", calls)
	}
}

// TestFileReadStreams: the file reaches the caller while the Service is
// still reading it (the server holds no whole file): the fake writes its
// second chunk only once the caller has the first.
func TestFileReadStreams(t *testing.T) {
	got1 := make(chan struct{})
	fake := &fakeService{}
	fake.readTo = func(ctx context.Context, limit int64, w io.Writer) (int64, error) {
		if _, err := w.Write(bytes.Repeat([]byte("a"), 100<<10)); err != nil {
			return 0, err
		}
		select {
		case <-got1:
		case <-time.After(10 * time.Second):
			return 0, errors.New("the caller never got the first chunk: the server buffered it")
		}
		n, err := w.Write([]byte("end"))
		return int64(100<<10 + n), err
	}
	srv := startServer(t, &Server{Service: fake, AllowedGID: -1})
	w := &firstChunk{n: 100 << 10, got: got1}
	n, err := (&api.Client{SocketPath: srv.sock}).ReadFileTo(context.Background(), "sb-1", "/f", nil, w)
	if err != nil || n != 100<<10+3 || !strings.HasSuffix(w.buf.String(), "aend") {
		t.Fatalf("read = %d %v (%d bytes)", n, err, w.buf.Len())
	}
}

// firstChunk closes got once n bytes were written to it.
type firstChunk struct {
	buf bytes.Buffer
	n   int
	got chan struct{}
}

func (f *firstChunk) Write(p []byte) (int, error) {
	f.buf.Write(p)
	if f.buf.Len() >= f.n && f.got != nil {
		close(f.got)
		f.got = nil
	}
	return len(p), nil
}

// TestFileWriteStreams: the Service reads the body while the caller is
// still sending it.
func TestFileWriteStreams(t *testing.T) {
	got1 := make(chan struct{})
	fake := &fakeService{}
	fake.writeFrom = func(ctx context.Context, limit int64, r io.Reader) (int64, error) {
		buf := make([]byte, 5)
		if _, err := io.ReadFull(r, buf); err != nil {
			return 0, err
		}
		close(got1)
		rest, err := io.ReadAll(r)
		return int64(5 + len(rest)), err
	}
	srv := startServer(t, &Server{Service: fake, AllowedGID: -1})
	pr, pw := io.Pipe()
	go func() {
		pw.Write([]byte("first"))
		select {
		case <-got1:
			pw.Write([]byte("second"))
			pw.Close()
		case <-time.After(10 * time.Second):
			pw.CloseWithError(errors.New("the Service never got the first chunk: the server buffered it"))
		}
	}()
	if err := (&api.Client{SocketPath: srv.sock}).WriteFileFrom(context.Background(), "sb-1", "/f", nil, 0, pr, -1); err != nil {
		t.Fatal(err)
	}
}

// TestFileReadBrokenMidStream: a read that fails after bytes went out is a
// broken stream to the caller, never a short file that ends well.
func TestFileReadBrokenMidStream(t *testing.T) {
	fake := &fakeService{}
	fake.readTo = func(ctx context.Context, limit int64, w io.Writer) (int64, error) {
		w.Write([]byte("partial"))
		return 7, errdefs.Errorf(errdefs.CodeUnavailable, "agent died")
	}
	srv := startServer(t, &Server{Service: fake, AllowedGID: -1})
	var out bytes.Buffer
	_, err := (&api.Client{SocketPath: srv.sock}).ReadFileTo(context.Background(), "sb-1", "/f", nil, &out)
	if errdefs.CodeOf(err) != errdefs.CodeUnavailable || !strings.Contains(err.Error(), "stream broken") {
		t.Errorf("read cut mid-stream: %v (got %q)", err, out.String())
	}
	if _, err := (&api.Client{SocketPath: srv.sock}).ReadFile(context.Background(), "sb-1", "/f"); err == nil {
		t.Error("ReadFile of a broken stream succeeded")
	}
}

// TestFileWriteOverCapChunked: a body of unknown length over the cap is
// refused (the Service's write fails, so nothing changes).
func TestFileWriteOverCapChunked(t *testing.T) {
	fake := &fakeService{}
	var serviceErr error
	fake.writeFrom = func(ctx context.Context, limit int64, r io.Reader) (int64, error) {
		n, err := io.Copy(io.Discard, r)
		serviceErr = err
		return n, err
	}
	srv := startServer(t, &Server{Service: fake, AllowedGID: -1, MaxStreamFileBytes: 16})
	err := (&api.Client{SocketPath: srv.sock}).WriteFileFrom(context.Background(), "sb-1", "/f", nil, 0, io.MultiReader(strings.NewReader(strings.Repeat("x", 10)), strings.NewReader(strings.Repeat("y", 10))), -1)
	if errdefs.CodeOf(err) != errdefs.CodeInvalidArgument || !strings.Contains(err.Error(), "file exceeds 16 bytes") {
		t.Errorf("write over the cap: %v", err)
	}
	if serviceErr == nil {
		t.Error("the Service's read of the body did not fail: it would have written a cut file")
	}
}

// TestExecViaRunsc: via=runsc sends JSON and SSE execs to ExecViaRunsc.
func TestExecViaRunsc(t *testing.T) {
	fake := &fakeService{exec: func(stdout, stderr io.Writer) (int, error) {
		stdout.Write([]byte("hi\n"))
		return 4, nil
	}}
	srv := startServer(t, &Server{Service: fake, AllowedGID: -1})
	var out bytes.Buffer
	code, err := (&api.Client{SocketPath: srv.sock}).ExecViaRunsc(context.Background(), "sb-1", api.ExecRequest{Args: []string{"echo", "hi"}}, &out, &out)
	if err != nil || code != 4 || out.String() != "hi\n" {
		t.Errorf("exec via runsc: %d %q %v", code, out.String(), err)
	}
	resp := rawDo(t, srv.sock, "POST", "/v1/sandboxes/sb-1/exec?via=runsc", map[string]string{"Content-Type": "application/json"}, []byte(`{"args":["echo"]}`))
	if resp.status != 200 || !strings.Contains(string(resp.body), `"exit_code":4`) {
		t.Errorf("JSON exec via runsc: %d %s", resp.status, resp.body)
	}
	want := []string{`ExecViaRunsc sb-1 ["echo" "hi"]`, `ExecViaRunsc sb-1 ["echo"]`}
	if calls := fake.Calls(); !reflect.DeepEqual(calls, want) {
		t.Errorf("calls = %q, want %q", calls, want)
	}
}

// hashWriter is a ResponseWriter that keeps only a digest of the body.
type hashWriter struct {
	h   http.Header
	sum hash.Hash
	n   int
}

func (w *hashWriter) Header() http.Header         { return w.h }
func (w *hashWriter) WriteHeader(int)             {}
func (w *hashWriter) Write(p []byte) (int, error) { w.n += len(p); return w.sum.Write(p) }

// A listing goes out an entry at a time: the same JSON as one marshalled
// value, while the server allocates a fraction of its size (a listing
// may be the agent client's whole byte budget; marshalling it whole
// doubled it).
func TestListingStreamed(t *testing.T) {
	l := api.DirListing{Path: "/d"}
	for i := range 50000 {
		l.Entries = append(l.Entries, api.FileInfo{Name: fmt.Sprintf("entry-%06d", i), Link: strings.Repeat("l", 200), Size: int64(i)})
	}
	want, _ := json.Marshal(l)
	w := &hashWriter{h: http.Header{}, sum: sha256.New()}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	writeListing(w, l)
	runtime.ReadMemStats(&after)
	// The streamed form differs only in whitespace: compare it compacted.
	var got, exp bytes.Buffer
	json.Compact(&exp, append(want, '\n'))
	w2 := &bufWriter{h: http.Header{}}
	writeListing(w2, l)
	if err := json.Compact(&got, w2.b.Bytes()); err != nil || !bytes.Equal(got.Bytes(), exp.Bytes()) {
		t.Fatalf("streamed listing differs from the marshalled one (%v)", err)
	}
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("listing of %d bytes: %d bytes allocated", w.n, alloc)
	if alloc > uint64(w.n)/4 {
		t.Fatalf("allocated %d bytes to send a listing of %d", alloc, w.n)
	}
}

type bufWriter struct {
	h http.Header
	b bytes.Buffer
}

func (w *bufWriter) Header() http.Header         { return w.h }
func (w *bufWriter) WriteHeader(int)             {}
func (w *bufWriter) Write(p []byte) (int, error) { return w.b.Write(p) }
