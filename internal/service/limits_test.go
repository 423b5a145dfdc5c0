package service

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/manager"
)

func quotaOf(n int64) manager.Quota {
	return manager.Quota{Sandboxes: n, CPUMillis: 1 << 40, MemoryBytes: 1 << 50, DiskBytes: 1 << 50, CreatesPerMin: 100000}
}

// TestConcurrentCreatesOverQuota: 200 concurrent creates of one owner with
// a quota of 5: exactly 5 succeed, the rest get quota_exceeded, and the
// node saw exactly 5 claims.
func TestConcurrentCreatesOverQuota(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	if _, err := e.store.SetQuota(ctx, "team-a", quotaOf(5)); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[string]int{}
	for range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox"})
			mu.Lock()
			codes[errCode(err)]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	e.node.Lock()
	claims := len(e.node.ClaimOps)
	e.node.Unlock()
	if codes[""] != 5 || codes[client.CodeQuotaExceeded] != 195 || claims != 5 {
		t.Fatalf("answers %v, node claims %d; want 5 created, 195 quota_exceeded, 5 claims", codes, claims)
	}
	t.Logf("200 concurrent creates over a quota of 5: %v, node claims %d", codes, claims)
	// Resources count too, and the create rate answers Retry-After.
	if _, err := e.store.SetQuota(ctx, "team-b", manager.Quota{Sandboxes: 10, CPUMillis: 1000, MemoryBytes: 1 << 30, DiskBytes: 1 << 30, CreatesPerMin: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.b.Create(ctx, client.CreateRequest{Template: "busybox", Resources: &client.Resources{CPU: "1500m"}}); errCode(err) != client.CodeQuotaExceeded {
		t.Fatalf("over the cpu quota: %v", err)
	}
	for i := range 2 {
		if _, err := e.b.Create(ctx, client.CreateRequest{Template: "busybox"}); err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
	}
	_, err := e.b.Create(ctx, client.CreateRequest{Template: "busybox"})
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != client.CodeQuotaExceeded || ce.RetryAfter <= 0 {
		t.Fatalf("over the create rate: %v (want quota_exceeded with Retry-After)", err)
	}
}

// TestFailedCreateReturnsQuota: a claim the node refuses for good frees
// the owner's share at once, and the sandbox shows failed with the reason.
func TestFailedCreateReturnsQuota(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	if _, err := e.store.SetQuota(ctx, "team-a", quotaOf(1)); err != nil {
		t.Fatal(err)
	}
	e.node.Lock()
	e.node.FailClaim = func(api.ClaimRequest) error { return errdefs.Errorf(errdefs.CodeInvalidArgument, "template broken") }
	e.node.Unlock()
	if _, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox"}); errCode(err) != client.CodeInvalidArgument {
		t.Fatalf("refused claim: %v", err)
	}
	l, err := e.a.List(ctx, client.ListOptions{State: client.StateFailed})
	if err != nil || len(l.Sandboxes) != 1 || !strings.Contains(l.Sandboxes[0].Reason, "template broken") {
		t.Fatalf("failed list = %+v, %v", l, err)
	}
	if _, err := e.a.Destroy(ctx, l.Sandboxes[0].ID); errCode(err) != client.CodeConflict {
		t.Fatalf("destroy of a failed create: %v", err)
	}
	e.node.Lock()
	e.node.FailClaim = nil
	e.node.Unlock()
	if _, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox"}); err != nil {
		t.Fatalf("create after the failed one: %v (its quota share was not returned)", err)
	}
	// Busy: the node's Retry-After reaches the caller.
	e.node.Lock()
	e.node.FailClaim = func(api.ClaimRequest) error { return errdefs.Busy(3*time.Second, "claims in flight at the limit") }
	e.node.Unlock()
	if _, err := e.store.SetQuota(ctx, "team-a", quotaOf(5)); err != nil {
		t.Fatal(err)
	}
	_, err = e.a.Create(ctx, client.CreateRequest{Template: "busybox"})
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != client.CodeUnavailable || ce.Status != 503 || ce.RetryAfter != 3*time.Second {
		t.Fatalf("busy node: %v", err)
	}
}

func TestBadInput(t *testing.T) {
	e := newEnv(t, func(s *Server) { s.MaxFileBytes = 1 << 10; s.MaxBodyBytes = 4 << 10 })
	ctx := invalid(context.Background())
	sb, err := e.a.Create(context.Background(), client.CreateRequest{Template: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	type tc struct {
		name, method, path, body string
		header                   map[string]string
		code                     string
	}
	json := map[string]string{"Content-Type": "application/json"}
	cases := []tc{
		{"unknown field", "POST", "/v1/sandboxes", `{"template":"busybox","templat":"x"}`, json, client.CodeInvalidArgument},
		{"trailing data", "POST", "/v1/sandboxes", `{"template":"busybox"} {}`, json, client.CodeInvalidArgument},
		{"not json", "POST", "/v1/sandboxes", `template=busybox`, map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, client.CodeUnsupportedMedia},
		{"oversized body", "POST", "/v1/sandboxes", `{"template":"busybox","labels":{"a":"` + strings.Repeat("x", 8<<10) + `"}}`, json, client.CodePayloadTooLarge},
		{"unknown template", "POST", "/v1/sandboxes", `{"template":"nope"}`, json, client.CodeInvalidArgument},
		{"bad cpu", "POST", "/v1/sandboxes", `{"template":"busybox","resources":{"cpu":"lots"}}`, json, client.CodeInvalidArgument},
		{"bad memory", "POST", "/v1/sandboxes", `{"template":"busybox","resources":{"memory":"-5Gi"}}`, json, client.CodeInvalidArgument},
		{"negative timeout", "POST", "/v1/sandboxes", `{"template":"busybox","timeout_sec":-1}`, json, client.CodeInvalidArgument},
		{"huge timeout", "POST", "/v1/sandboxes", `{"template":"busybox","timeout_sec":99999999999}`, json, client.CodeInvalidArgument},
		{"bad label", "POST", "/v1/sandboxes", `{"template":"busybox","labels":{"BAD KEY":"x"}}`, json, client.CodeInvalidArgument},
		{"bad env", "POST", "/v1/sandboxes", `{"template":"busybox","env":{"A=B":"x"}}`, json, client.CodeInvalidArgument},
		{"bad network", "POST", "/v1/sandboxes", `{"template":"busybox","network":{"mode":"everything"}}`, json, client.CodeInvalidArgument},
		{"bad wait", "POST", "/v1/sandboxes?wait=maybe", `{"template":"busybox"}`, json, client.CodeInvalidArgument},
		{"bad id", "GET", "/v1/sandboxes/BAD_ID", "", nil, client.CodeInvalidArgument},
		{"long id", "GET", "/v1/sandboxes/" + strings.Repeat("a", 100), "", nil, client.CodeInvalidArgument},
		{"unknown id", "GET", "/v1/sandboxes/sb-0000", "", nil, client.CodeNotFound},
		{"bad limit", "GET", "/v1/sandboxes?limit=100000", "", nil, client.CodeInvalidArgument},
		{"bad cursor", "GET", "/v1/sandboxes?cursor=not-base64!", "", nil, client.CodeInvalidArgument},
		{"bad state", "GET", "/v1/sandboxes?state=happy", "", nil, client.CodeInvalidArgument},
		{"traversal", "GET", "/v1/sandboxes/" + sb.ID + "/files?path=/tmp/../etc/passwd", "", nil, client.CodeInvalidArgument},
		{"relative", "GET", "/v1/sandboxes/" + sb.ID + "/files?path=etc/passwd", "", nil, client.CodeInvalidArgument},
		{"traversal stat", "GET", "/v1/sandboxes/" + sb.ID + "/files/stat?path=/..", "", nil, client.CodeInvalidArgument},
		{"traversal move", "POST", "/v1/sandboxes/" + sb.ID + "/files/move", `{"from":"/a","to":"/x/../../b"}`, json, client.CodeInvalidArgument},
		{"traversal mkdir", "POST", "/v1/sandboxes/" + sb.ID + "/files/mkdir", `{"path":"/a/./b"}`, json, client.CodeInvalidArgument},
		{"nul path", "GET", "/v1/sandboxes/" + sb.ID + "/files/list?path=/a%00b", "", nil, client.CodeInvalidArgument},
		{"oversized file", "PUT", "/v1/sandboxes/" + sb.ID + "/files?path=/big", strings.Repeat("x", 2<<10), map[string]string{"Content-Type": "application/octet-stream"}, client.CodePayloadTooLarge},
		{"empty exec", "POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"args":[]}`, json, client.CodeInvalidArgument},
		{"exec timeout", "POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"args":["true"],"timeout_sec":-4}`, json, client.CodeInvalidArgument},
		{"zero timeout", "POST", "/v1/sandboxes/" + sb.ID + "/timeout", `{"timeout_sec":0}`, json, client.CodeInvalidArgument},
		{"bad idempotency key", "POST", "/v1/sandboxes/" + sb.ID + "/timeout", `{"timeout_sec":5}`, map[string]string{"Content-Type": "application/json", "Idempotency-Key": strings.Repeat("k", 300)}, client.CodeInvalidArgument},
		{"bad tail", "GET", "/v1/sandboxes/" + sb.ID + "/logs?tail=-1", "", nil, client.CodeInvalidArgument},
		{"bad idle", "GET", "/v1/sandboxes/" + sb.ID + "/logs?follow=true&idle_sec=999999", "", nil, client.CodeInvalidArgument},
		{"bad follow", "GET", "/v1/sandboxes/" + sb.ID + "/logs?follow=yes", "", nil, client.CodeInvalidArgument},
		{"no route", "GET", "/v1/nothing", "", nil, client.CodeNotFound},
		{"wrong method", "PATCH", "/v1/sandboxes/" + sb.ID, "", nil, client.CodeMethodNotAllowed},
	}
	for _, c := range cases {
		resp, body := e.raw(ctx, c.method, c.path, e.keyA, strings.NewReader(c.body), c.header)
		if !strings.Contains(string(body), `"code":"`+c.code+`"`) || resp.StatusCode != statusOf[c.code] {
			t.Errorf("%s: %d %s; want %d %s", c.name, resp.StatusCode, body, statusOf[c.code], c.code)
		}
	}
	// Bad input changed nothing: still one sandbox, nothing else claimed.
	l, err := e.a.List(context.Background(), client.ListOptions{})
	if err != nil || len(l.Sandboxes) != 1 || len(e.node.ClaimOps) != 1 {
		t.Fatalf("after bad input: %d sandboxes, %d claims, %v", len(l.Sandboxes), len(e.node.ClaimOps), err)
	}
}

// TestSlowLorisCutOff: a client that sends its header slower than
// ReadHeaderTimeout is disconnected, and the server answers others
// meanwhile.
func TestSlowLorisCutOff(t *testing.T) {
	e := newEnv(t, func(s *Server) { s.ReadHeaderTimeout = 300 * time.Millisecond; s.BodyTimeout = 500 * time.Millisecond })
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	if _, err := io.WriteString(conn, "GET /v1/templates HTTP/1.1\r\nHost: x\r\n"); err != nil {
		t.Fatal(err)
	}
	cut := make(chan time.Duration, 1)
	go func() {
		for i := 0; ; i++ {
			time.Sleep(100 * time.Millisecond)
			if _, err := fmt.Fprintf(conn, "X-Slow-%d: 1\r\n", i); err != nil {
				cut <- time.Since(start)
				return
			}
			if time.Since(start) > 10*time.Second {
				cut <- 0
				return
			}
		}
	}()
	// Meanwhile others are served.
	if _, err := e.a.Templates(context.Background()); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, _ := io.ReadAll(conn)
	d := <-cut
	if d == 0 || d > 3*time.Second {
		t.Fatalf("slow client still connected after %v (read %q)", time.Since(start), b)
	}
	t.Logf("slow-loris client cut off after %v", d.Round(time.Millisecond))

	// A slow body: headers in time, then a byte every 100 ms.
	conn2, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	start = time.Now()
	fmt.Fprintf(conn2, "POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{", e.keyA)
	go func() {
		for range 100 {
			time.Sleep(100 * time.Millisecond)
			if _, err := io.WriteString(conn2, " "); err != nil {
				return
			}
		}
	}()
	conn2.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, _ = io.ReadAll(conn2)
	if !strings.Contains(string(b), "400 Bad Request") || !strings.Contains(string(b), "did not arrive") || time.Since(start) > 5*time.Second {
		t.Fatalf("slow body: after %v read %q", time.Since(start), b)
	}
	t.Logf("slow body answered and cut after %v", time.Since(start).Round(time.Millisecond))
}

// TestKeyNeverLogged: the access log names owner, method, path and
// status, never the key, even for a wrong key.
func TestKeyNeverLogged(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	if _, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox"}); err != nil {
		t.Fatal(err)
	}
	wrong := e.keyA[:20] + strings.Repeat("Z", len(e.keyA)-20)
	resp, _ := e.raw(ctx, "GET", "/v1/sandboxes", wrong, nil, nil)
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("wrong key: %d", resp.StatusCode)
	}
	logs := e.logs.String()
	if !strings.Contains(logs, "owner=team-a") || !strings.Contains(logs, "status=401") {
		t.Fatalf("access log lacks owner or 401:\n%s", logs)
	}
	for _, k := range []string{e.keyA, wrong, e.keyA[4:]} {
		if strings.Contains(logs, k) {
			t.Fatalf("key in the log")
		}
	}
	if bytes.Contains([]byte(logs), []byte("Bearer")) {
		t.Fatal("Authorization header in the log")
	}
}

// TestCreateOutlivesItsCaller: a caller that gives up while the claim
// runs does not leave it pending: the claim completes and GET shows it
// ready.
func TestCreateOutlivesItsCaller(t *testing.T) {
	e := newEnv(t, nil)
	e.node.Lock()
	e.node.FailClaim = func(api.ClaimRequest) error { time.Sleep(300 * time.Millisecond); return nil }
	e.node.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox", Labels: map[string]string{"k": "gone"}}); err == nil {
		t.Fatal("the caller's deadline did not cut its call")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		l, err := e.a.List(context.Background(), client.ListOptions{Labels: map[string]string{"k": "gone"}})
		if err == nil && len(l.Sandboxes) == 1 && l.Sandboxes[0].State == client.StateReady {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("abandoned create: %+v, %v; want ready", l, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestUnprovenCleanupKeepsQuota: a release whose proof is not clean does
// not give the owner's share back; a clean one does.
func TestUnprovenCleanupKeepsQuota(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	if _, err := e.store.SetQuota(ctx, "team-a", quotaOf(1)); err != nil {
		t.Fatal(err)
	}
	sb, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	e.node.Lock()
	e.node.Unclean = []string{"cgroup_removed"}
	e.node.Unlock()
	d, err := e.a.Destroy(ctx, sb.ID)
	if err != nil || d.Proof.Clean || len(d.Proof.FailedChecks) != 1 {
		t.Fatalf("destroy with an unclean proof = %+v, %v", d.Proof, err)
	}
	if _, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox"}); errCode(err) != client.CodeQuotaExceeded {
		t.Fatalf("create after an unproven cleanup: %v, want quota_exceeded (the share stays taken)", err)
	}
}
