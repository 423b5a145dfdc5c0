package apiserver

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/testutil"
)

// fakeService records every call and answers from its fields.
type fakeService struct {
	mu    sync.Mutex
	calls []string

	err     error // returned by every method when set
	node    api.Node
	claim   api.ClaimResponse
	release api.ReleaseResponse
	list    api.SandboxList
	sandbox api.Sandbox
	proof   api.CleanupProof
	file    []byte
	written []byte
	// exec writes the command's output; nil exits 0 silently.
	exec func(stdout, stderr io.Writer) (int, error)
	// block, when set, is waited on by Node (to hold a request in flight).
	block chan struct{}
	// slow, when set, is waited on by Claim and Exec: a runtime that takes
	// its time.
	slow chan struct{}
	// logs writes the log; nil writes nothing and ends with "end of log".
	logs func(ctx context.Context, req api.LogsRequest, w io.Writer) (api.LogsEnd, error)
	agentFake
}

func (f *fakeService) record(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
}

func (f *fakeService) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func (f *fakeService) Node(ctx context.Context) (api.Node, error) {
	f.record("Node")
	if f.block != nil {
		<-f.block
	}
	return f.node, f.err
}

func (f *fakeService) Claim(ctx context.Context, id string, req api.ClaimRequest) (api.ClaimResponse, error) {
	f.record("Claim %s %s gen=%d", id, req.OperationID, req.Generation)
	if f.slow != nil {
		<-f.slow
	}
	return f.claim, f.err
}

func (f *fakeService) Exec(ctx context.Context, id string, req api.ExecRequest, stdout, stderr io.Writer) (int, error) {
	f.record("Exec %s %q", id, req.Args)
	if f.slow != nil {
		<-f.slow
	}
	if f.exec != nil {
		return f.exec(stdout, stderr)
	}
	return 0, f.err
}

func (f *fakeService) ReadFile(ctx context.Context, id, path string, limit int64) ([]byte, error) {
	f.record("ReadFile %s %s limit=%d", id, path, limit)
	return f.file, f.err
}

func (f *fakeService) WriteFile(ctx context.Context, id, path string, data []byte) error {
	f.record("WriteFile %s %s %d", id, path, len(data))
	f.mu.Lock()
	f.written = bytes.Clone(data)
	f.mu.Unlock()
	return f.err
}

func (f *fakeService) Release(ctx context.Context, id string, req api.ReleaseRequest) (api.ReleaseResponse, error) {
	f.record("Release %s %s gen=%d", id, req.OperationID, req.Generation)
	return f.release, f.err
}

func (f *fakeService) UpdateNetwork(ctx context.Context, id string, p api.NetworkPolicy) (api.Sandbox, error) {
	f.record("UpdateNetwork %s %s %d rules", id, p.EffectiveMode(), len(p.Rules))
	return f.sandbox, f.err
}

func (f *fakeService) List(ctx context.Context) (api.SandboxList, error) {
	f.record("List")
	if f.err != nil && f.err.Error() == "panic" {
		panic("list exploded")
	}
	return f.list, f.err
}

func (f *fakeService) Get(ctx context.Context, id string) (api.Sandbox, error) {
	f.record("Get %s", id)
	return f.sandbox, f.err
}

func (f *fakeService) Proof(ctx context.Context, op string) (api.CleanupProof, error) {
	f.record("Proof %s", op)
	return f.proof, f.err
}

func (f *fakeService) Logs(ctx context.Context, id string, req api.LogsRequest, w io.Writer) (api.LogsEnd, error) {
	f.record("Logs %s source=%s tail=%d follow=%v idle=%d", id, req.Source, req.Tail, req.Follow, req.IdleSec)
	if f.logs != nil {
		return f.logs(ctx, req, w)
	}
	return api.LogsEnd{Reason: "end of log"}, f.err
}

type testServer struct {
	sock string
	logs *testutil.Buffer
	stop func() error // shuts down and returns Serve's result
}

// startServer serves s on a fresh Unix socket until the test ends.
func startServer(t *testing.T, s *Server) *testServer {
	t.Helper()
	return startServerIn(t, s, testutil.SocketDir(t))
}

func startServerIn(t *testing.T, s *Server, dir string) *testServer {
	t.Helper()
	logs := &testutil.Buffer{}
	if s.Logger == nil {
		s.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	sock := filepath.Join(dir, "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	var once sync.Once
	var serveErr error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case serveErr = <-done:
			case <-time.After(10 * time.Second):
				serveErr = errors.New("Serve did not return 10s after its context was done")
			}
		})
		return serveErr
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return &testServer{sock: sock, logs: logs, stop: stop}
}

type rawResponse struct {
	status int
	header http.Header
	body   []byte
}

// rawDo sends a hand-written HTTP/1.1 request, so the test controls every
// byte of the target and body. The body is written concurrently with
// reading the answer: the server answers an oversized body before reading
// it all.
func rawDo(t *testing.T, sock, method, target string, header map[string]string, body []byte) rawResponse {
	t.Helper()
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	var head strings.Builder
	fmt.Fprintf(&head, "%s %s HTTP/1.1\r\nHost: ctld\r\nConnection: close\r\nContent-Length: %d\r\n", method, target, len(body))
	for k, v := range header {
		fmt.Fprintf(&head, "%s: %s\r\n", k, v)
	}
	head.WriteString("\r\n")
	go func() {
		// Errors are expected when the server refuses the body early.
		_, _ = conn.Write([]byte(head.String()))
		_, _ = conn.Write(body)
	}()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("%s %s: read response: %v", method, target, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, target, err)
	}
	return rawResponse{status: resp.StatusCode, header: resp.Header, body: b}
}
