package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ctld/ctld/internal/ha"
	"github.com/ctld/ctld/internal/metrics"
)

// TestServeDebug: the debug socket is made 0600 (root-only: pprof shows
// memory) and serves /metrics and pprof; --metrics-listen's address for
// this slot serves /metrics without pprof, another slot's is not bound.
func TestServeDebug(t *testing.T) {
	free := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().String()
	}
	mine, other := free(), free()
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m := metrics.New(prometheus.NewRegistry(), func() ha.Status { return ha.Status{Slot: "a", Role: ha.RoleStandby} })
	o := runOpts{slot: "a", metricsListen: []string{"a=" + mine, "b=" + other}}
	if err := serveDebug(ctx, dir, o, m, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	sock := debugPath(dir, "a")
	st, err := os.Lstat(sock)
	if err != nil || st.Mode().Type() != os.ModeSocket || st.Mode().Perm() != 0o600 {
		t.Fatalf("debug socket %s: %v, %v; want a socket with mode 0600", sock, st.Mode(), err)
	}
	unix := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	get := func(hc *http.Client, url string) (int, string) {
		resp, err := hc.Get(url)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get(unix, "http://ctld/metrics"); code != 200 || !strings.Contains(body, `ctld_role{role="standby",slot="a"} 1`) {
		t.Errorf("debug /metrics: %d\n%.300s", code, body)
	}
	if code, _ := get(unix, "http://ctld/debug/pprof/heap"); code != 200 {
		t.Errorf("debug pprof heap: %d", code)
	}
	if code, body := get(http.DefaultClient, "http://"+mine+"/metrics"); code != 200 || !strings.Contains(body, "ctld_role") {
		t.Errorf("TCP /metrics: %d", code)
	}
	if code, _ := get(http.DefaultClient, "http://"+mine+"/debug/pprof/heap"); code != 404 {
		t.Errorf("TCP pprof: %d, want 404", code)
	}
	if c, err := net.Dial("tcp", other); err == nil {
		c.Close()
		t.Errorf("slot b's address %s is bound by slot a", other)
	}
	// A second instance of the slot cannot take a live socket over.
	if err := serveDebug(ctx, dir, runOpts{slot: "a"}, m, slog.New(slog.DiscardHandler)); err == nil {
		t.Errorf("a second debug server took the live socket over")
	}
}
