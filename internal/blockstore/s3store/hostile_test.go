package s3store_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/blockstore/s3store"
)

// hostileS3 is an S3 endpoint on loopback that answers every GetObject
// with an endless body of 'x' (up to 1 GiB) and the Content-Length of
// claim ("": none, chunked), counting what it wrote.
func hostileS3(t *testing.T, claim func(key string) string) (endpoint string, written *atomic.Int64) {
	t.Helper()
	written = new(atomic.Int64)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if cl := claim(r.URL.Path); cl != "" {
			w.Header().Set("Content-Length", cl)
		}
		w.WriteHeader(http.StatusOK)
		buf := []byte(strings.Repeat("x", 32<<10))
		for range (1 << 30) / len(buf) {
			n, err := w.Write(buf)
			written.Add(int64(n))
			if err != nil {
				return
			}
		}
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String(), written
}

// countingTransport counts the response body bytes the client read.
type countingTransport struct{ read atomic.Int64 }

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(r)
	if resp != nil {
		resp.Body = &countingBody{ReadCloser: resp.Body, n: &c.read}
	}
	return resp, err
}

type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// TestGetBoundedAgainstHostileServer (issue 21): a GetObject answer
// larger than its key's kind allows is ErrTooLarge, never data: refused
// on its Content-Length before a byte of the body is read, and, when the
// server sends no length, after reading at most limit+1 bytes of an
// endless body (the reader never holds more).
func TestGetBoundedAgainstHostileServer(t *testing.T) {
	const head = "sandboxes/sb/head/00000000000000000001"
	const chunk = "sandboxes/sb/chunks/ab/abababababababababababababababababababababababababababababababab"
	cases := []struct {
		name, key, length string
		limit             int64
		maxRead           int64
	}{
		{"head announcing 1 GiB", head, strconv.Itoa(1 << 30), blockstore.MaxSmallObject, 0},
		{"head with no length", head, "", blockstore.MaxSmallObject, blockstore.MaxSmallObject + 1},
		{"chunk announcing 1 GiB", chunk, strconv.Itoa(1 << 30), blockstore.MaxChunkObject, 0},
		{"chunk with no length", chunk, "", blockstore.MaxChunkObject, blockstore.MaxChunkObject + 1},
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			endpoint, written := hostileS3(t, func(string) string { return c.length })
			tr := &countingTransport{}
			st, err := s3store.New(s3store.Config{Endpoint: endpoint, Bucket: "b", AccessKey: "a", SecretKey: "s", HTTPClient: &http.Client{Transport: tr}})
			if err != nil {
				t.Fatal(err)
			}
			b, err := st.Get(context.Background(), c.key)
			if !errors.Is(err, blockstore.ErrTooLarge) || b != nil {
				t.Fatalf("get: %d bytes, %v; want ErrTooLarge and nothing", len(b), err)
			}
			if got := tr.read.Load(); got > c.maxRead {
				t.Fatalf("read %d bytes of the body, want at most %d (limit %d)", got, c.maxRead, c.limit)
			}
			t.Logf("%v; read %d bytes of the body (limit %d), the server wrote %d", err, tr.read.Load(), c.limit, written.Load())
		})
	}
}

// TestGetRangeBoundedAgainstHostileServer: a server that ignores the
// Range of a pack read and sends the whole (here endless) object is
// refused on its Content-Length before the body is read, or, with no
// length, after at most length+1 bytes; nothing is returned as data.
func TestGetRangeBoundedAgainstHostileServer(t *testing.T) {
	const pack = "templates/t/packs/0123456789abcdef0123456789abcdef"
	const length = 70000
	for _, c := range []struct {
		name, length string
		maxRead      int64
	}{
		{"announcing 1 GiB", strconv.Itoa(1 << 30), 0},
		{"with no length", "", length + 1},
	} {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			endpoint, _ := hostileS3(t, func(string) string { return c.length })
			tr := &countingTransport{}
			st, err := s3store.New(s3store.Config{Endpoint: endpoint, Bucket: "b", AccessKey: "a", SecretKey: "s", HTTPClient: &http.Client{Transport: tr}})
			if err != nil {
				t.Fatal(err)
			}
			b, err := st.GetRange(context.Background(), pack, 1<<20, length, nil)
			if err == nil || b != nil {
				t.Fatalf("GetRange: %d bytes, %v; want an error and nothing", len(b), err)
			}
			if got := tr.read.Load(); got > c.maxRead {
				t.Fatalf("read %d bytes of the body, want at most %d", got, c.maxRead)
			}
			t.Logf("%v; read %d bytes of the body", err, tr.read.Load())
		})
	}
}
