package service

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	legacyrouter "github.com/getkin/kin-openapi/routers/legacy"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/blockstore/dirstore"
	"github.com/ctld/ctld/internal/manager"
	"github.com/ctld/ctld/internal/manager/fakenode"
	"github.com/ctld/ctld/internal/testutil"
)

func TestMain(m *testing.M) {
	// Event streams are validated as opaque text (their events are
	// checked by the tests that read them).
	openapi3filter.RegisterBodyDecoder("text/event-stream", openapi3filter.FileBodyDecoder)
	code := m.Run()
	if code == 0 && os.Getenv("SERVICE_COVERAGE") != "off" {
		code = checkCoverage()
	}
	os.Exit(code)
}

// exercised records the OpenAPI operations the suite called and got a
// validated answer from; TestMain fails the run if one is missing (when
// the whole suite ran).
var exercised = struct {
	sync.Mutex
	ops map[string]bool
	all bool
}{ops: map[string]bool{}}

func checkCoverage() int {
	exercised.Lock()
	defer exercised.Unlock()
	if !exercised.all {
		return 0
	}
	doc := loadDoc()
	var missing []string
	for _, pi := range doc.Paths.Map() {
		for _, op := range pi.Operations() {
			if !exercised.ops[op.OperationID] {
				missing = append(missing, op.OperationID)
			}
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		os.Stderr.WriteString("operations of openapi.json no test exercised: " + strings.Join(missing, ", ") + "\n")
		return 1
	}
	return 0
}

func loadDoc() *openapi3.T {
	doc, err := openapi3.NewLoader().LoadFromData(OpenAPI)
	if err != nil {
		panic(err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		panic(err)
	}
	doc.Servers = nil // match any host: the tests' ports are random
	return doc
}

type invalidKey struct{}

// invalid marks a request the test sends knowing it breaks the document
// (bad input tests): its request is not validated, its answer still is.
func invalid(ctx context.Context) context.Context { return context.WithValue(ctx, invalidKey{}, true) }

// validator is an http.RoundTripper that checks every request and answer
// against the OpenAPI document.
type validator struct {
	t      testing.TB
	router routers.Router
	base   http.RoundTripper
}

func newValidator(t testing.TB) *validator {
	r, err := legacyrouter.NewRouter(loadDoc())
	if err != nil {
		t.Fatal(err)
	}
	return &validator{t: t, router: r, base: &http.Transport{MaxConnsPerHost: 0, MaxIdleConnsPerHost: 64}}
}

func (v *validator) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		var err error
		if body, err = io.ReadAll(req.Body); err != nil {
			return nil, err
		}
		req.Body.Close()
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	expectInvalid, _ := req.Context().Value(invalidKey{}).(bool)
	opts := &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, MultiError: true}
	route, params, ferr := v.router.FindRoute(req)
	var in *openapi3filter.RequestValidationInput
	if ferr == nil {
		vreq := req.Clone(req.Context())
		vreq.Body = io.NopCloser(bytes.NewReader(body))
		in = &openapi3filter.RequestValidationInput{Request: vreq, PathParams: params, Route: route, Options: opts}
		if err := openapi3filter.ValidateRequest(req.Context(), in); err != nil && !expectInvalid {
			v.t.Errorf("request %s %s does not match openapi.json: %v", req.Method, req.URL.Path, err)
		}
	} else if !expectInvalid {
		v.t.Errorf("request %s %s: no route in openapi.json: %v", req.Method, req.URL.Path, ferr)
	}
	resp, err := v.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if in != nil && resp.StatusCode == http.StatusOK && req.URL.Path == "/v1/events" {
		// A stream that does not end: its status and headers are checked
		// here, each event's data by the test against the Event schema.
		hopts := *opts
		hopts.ExcludeResponseBody = true
		out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header, Options: &hopts}
		if err := openapi3filter.ValidateResponse(req.Context(), out); err != nil {
			v.t.Errorf("events stream answer does not match openapi.json: %v", err)
		}
		exercised.Lock()
		exercised.ops[route.Operation.OperationID] = true
		exercised.Unlock()
		return resp, nil
	}
	rbody, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(rbody))
	if in == nil {
		// No route: the answer must still be the one error shape.
		var eb client.ErrorBody
		if err := json.Unmarshal(rbody, &eb); err != nil || eb.Error.Code == "" || statusOf[eb.Error.Code] != resp.StatusCode {
			v.t.Errorf("%s %s: answer %d %q is not the error shape", req.Method, req.URL.Path, resp.StatusCode, rbody)
		}
		return resp, nil
	}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header, Options: opts}
	out.SetBodyBytes(rbody)
	if err := openapi3filter.ValidateResponse(req.Context(), out); err != nil {
		v.t.Errorf("answer %d to %s %s does not match openapi.json: %v\nbody: %.500s", resp.StatusCode, req.Method, req.URL.Path, err, rbody)
	}
	if resp.StatusCode >= 400 {
		var eb client.ErrorBody
		if err := json.Unmarshal(rbody, &eb); err != nil || statusOf[eb.Error.Code] != resp.StatusCode {
			v.t.Errorf("%s %s: error %d with code %q: the status does not match the code", req.Method, req.URL.Path, resp.StatusCode, eb.Error.Code)
		}
	}
	if resp.StatusCode < 300 {
		exercised.Lock()
		exercised.ops[route.Operation.OperationID] = true
		exercised.Unlock()
	}
	return resp, nil
}

// env is a running service over the fake node.
type env struct {
	t       *testing.T
	node    *fakenode.Node
	socket  string
	dbPath  string
	store   *manager.Store
	srv     *Server
	url     string
	logs    *testutil.Buffer
	repo    *blockstore.Repo
	bstore  *dirstore.Store
	keyA    string
	keyB    string
	a, b    *client.Client
	v       *validator
	stop    func()
	clock   *testClock
	stopped bool
}

type testClock struct {
	mu  sync.Mutex
	off time.Duration
}

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.off)
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	c.off += d
	c.mu.Unlock()
}

var testTemplates = []client.Template{{Name: "busybox", Mode: "overlay"}, {Name: "debian", Mode: "block"}}

// newEnv starts the fake node, the store with owners team-a and team-b
// (a key each) and the server.
func newEnv(t *testing.T, tune func(*Server)) *env {
	t.Helper()
	e := &env{t: t, node: fakenode.New("node-1"), logs: &testutil.Buffer{}, clock: &testClock{}}
	e.node.BlockStore = true
	e.socket = fakenode.Serve(t, e.node)
	e.dbPath = filepath.Join(t.TempDir(), "manager.db")
	var err error
	if e.bstore, err = dirstore.Open(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	nk, _, err := blockstore.GenerateNodeKey("node-1")
	if err != nil {
		t.Fatal(err)
	}
	if e.repo, err = blockstore.New(e.bstore, nk, blockstore.Options{}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	st, err := manager.OpenStore(ctx, e.dbPath, e.clock.now)
	if err != nil {
		t.Fatal(err)
	}
	e.store = st
	for _, o := range []string{"team-a", "team-b"} {
		if _, err := st.CreateOwner(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	if e.keyA, _, err = st.CreateKey(ctx, "team-a"); err != nil {
		t.Fatal(err)
	}
	if e.keyB, _, err = st.CreateKey(ctx, "team-b"); err != nil {
		t.Fatal(err)
	}
	e.start(tune)
	e.v = newValidator(t)
	e.a = &client.Client{BaseURL: e.url, Key: e.keyA, HTTP: &http.Client{Transport: e.v}}
	e.b = &client.Client{BaseURL: e.url, Key: e.keyB, HTTP: &http.Client{Transport: e.v}}
	t.Cleanup(func() {
		e.shutdown()
		st.Close()
		for _, k := range []string{e.keyA, e.keyB} {
			if strings.Contains(e.logs.String(), k) || strings.Contains(e.logs.String(), k[16:]) {
				t.Errorf("an API key is in the server's log")
			}
		}
	})
	return e
}

// start starts a server on the env's store and node.
func (e *env) start(tune func(*Server)) {
	log := slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	m := &manager.Manager{Store: e.store, Client: &api.Client{SocketPath: e.socket}, Log: log}
	e.srv = &Server{Manager: m, Store: e.store, Log: log, Templates: testTemplates, Now: e.clock.now, TimerInterval: 20 * time.Millisecond,
		Volumes: BlockVolumes{Repo: e.repo, TmpDir: e.t.TempDir()}}
	if tune != nil {
		tune(e.srv)
	}
	addr := "127.0.0.1:0"
	if e.url != "" {
		addr = strings.TrimPrefix(e.url, "http://")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		e.t.Fatal(err)
	}
	e.url = "http://" + ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	srv := e.srv
	go func() { done <- srv.Serve(ctx, ln) }()
	e.stopped = false
	e.stop = func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("serve: %v", err)
		}
	}
}

func (e *env) shutdown() {
	if !e.stopped {
		e.stopped = true
		e.stop()
	}
}

// raw sends a request with no client, validated like the client's.
func (e *env) raw(ctx context.Context, method, path, key string, body io.Reader, header map[string]string) (*http.Response, []byte) {
	e.t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, e.url+path, body)
	if err != nil {
		e.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := (&http.Client{Transport: e.v}).Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func errCode(err error) string {
	var ce *client.Error
	if e, ok := err.(*client.Error); ok {
		ce = e
		return ce.Code
	}
	if err == nil {
		return ""
	}
	return "non-api: " + err.Error()
}

// released counts the node's releases of sandbox id (claims' releases
// with distinct operation ids that the node carried out).
func (e *env) nodeState(id string) api.SandboxState {
	sb, err := e.node.Get(context.Background(), id)
	if err != nil {
		return ""
	}
	return sb.State
}
