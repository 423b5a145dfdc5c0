package e2e

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/ha"
)

// scrape is one scrape of a metrics endpoint: series text ("name{labels}")
// to value.
type scrape map[string]float64

// get fetches path from the debug socket of slot (over HTTP on the Unix
// socket, as `curl --unix-socket` would) and returns status and body.
func (e *env) debugGet(t *testing.T, slot, path string) (int, string) {
	t.Helper()
	sock := filepath.Join(e.runDir, "debug-"+slot+".sock")
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	return httpGet(t, hc, "http://ctld"+path)
}

func httpGet(t *testing.T, hc *http.Client, url string) (int, string) {
	t.Helper()
	resp, err := hc.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		t.Fatalf("read %s: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

func parseScrape(t *testing.T, body string) scrape {
	t.Helper()
	out := scrape{}
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		v, err := strconv.ParseFloat(l[i+1:], 64)
		if i < 0 || err != nil {
			t.Fatalf("bad exposition line %q", l)
		}
		out[l[:i]] = v
	}
	return out
}

func (e *env) metrics(t *testing.T, slot string) scrape {
	t.Helper()
	code, body := e.debugGet(t, slot, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("scrape ctld@%s: %d %s", slot, code, body)
	}
	return parseScrape(t, body)
}

// want checks series against values, naming what each should be.
func (s scrape) want(t *testing.T, when string, series map[string]float64) {
	t.Helper()
	for k, v := range series {
		got, ok := s[k]
		if !ok || got != v {
			t.Errorf("%s: %s = %v (present %v), want %v", when, k, got, ok, v)
		}
	}
}

// TestMetricsMoveWithClaimAndRelease scrapes the real ctld pair over
// their root-only debug sockets (and the TCP address --metrics-listen
// gives each slot): the primary's node metrics move with a claim, an
// exec, a failed request and a release; the standby serves its role
// only; pprof answers on the socket and not over TCP.
func TestMetricsMoveWithClaimAndRelease(t *testing.T) {
	e := newEnv(t)
	e.args = append(e.args, "--metrics-listen", "a=127.0.0.1:19464", "--metrics-listen", "b=127.0.0.1:19465")
	e.start("a")
	e.waitPrimary("a", 60*time.Second)
	e.start("b")
	e.waitRole("b", ha.RoleStandby, 30*time.Second)

	for _, slot := range []string{"a", "b"} {
		sock := filepath.Join(e.runDir, "debug-"+slot+".sock")
		st, err := os.Lstat(sock)
		if err != nil {
			t.Fatalf("debug socket of %s: %v", slot, err)
		}
		sys := st.Sys().(*syscall.Stat_t)
		if st.Mode().Type() != os.ModeSocket || st.Mode().Perm() != 0o600 || sys.Uid != 0 {
			t.Errorf("debug socket %s: mode %v uid %d, want a socket 0600 owned by root (pprof shows memory)", sock, st.Mode(), sys.Uid)
		}
	}

	before := e.metrics(t, "a")
	before.want(t, "primary before the claim", map[string]float64{
		`ctld_role{role="primary",slot="a"}`:    1,
		`ctld_role{role="standby",slot="a"}`:    0,
		`ctld_generations{state="ready"}`:       0,
		`ctld_node_cpu_cores{pool="leased"}`:    0,
		`ctld_node_memory_bytes{pool="leased"}`: 0,
		`ctld_withheld_generations`:             0,
		`ctld_takeover_duration_seconds_count`:  1,
	})
	if n := before[`ctld_claim_step_duration_seconds_count{step="total"}`]; n != 0 {
		t.Errorf("claims timed before any claim: %v", n)
	}
	if before[`ctld_node_cpu_cores{pool="allocatable"}`] <= 0 || before[`ctld_journal_size_bytes`] <= 0 {
		t.Errorf("allocatable cpu %v, journal size %v: want both > 0", before[`ctld_node_cpu_cores{pool="allocatable"}`], before[`ctld_journal_size_bytes`])
	}

	c := e.client()
	cx := ctx(t, 3*time.Minute)
	if _, err := c.Claim(cx, "m1", claimReq("claim-m1", 1)); err != nil {
		t.Fatalf("claim: %v", err)
	}
	// A replay answers the stored result: its timings are not counted again.
	if _, err := c.Claim(cx, "m1", claimReq("claim-m1", 1)); err != nil {
		t.Fatalf("replayed claim: %v", err)
	}
	if r, err := c.Exec(cx, "m1", api.ExecRequest{Args: []string{"/bin/true"}}); err != nil || r.ExitCode != 0 {
		t.Fatalf("exec: %+v, %v", r, err)
	}
	if _, err := c.Get(cx, "nobody"); codeOf(err) != errdefs.CodeNotFound {
		t.Fatalf("get of an unknown sandbox: %v, want not_found", err)
	}
	claimed := e.metrics(t, "a")
	claimed.want(t, "after the claim", map[string]float64{
		`ctld_generations{state="ready"}`:                                                1,
		`ctld_node_cpu_cores{pool="leased"}`:                                             0.5,
		`ctld_node_memory_bytes{pool="leased"}`:                                          256 << 20,
		`ctld_claim_step_duration_seconds_count{step="total"}`:                           1,
		`ctld_claim_step_duration_seconds_count{step="runsc"}`:                           1,
		`ctld_api_request_duration_seconds_count{route="POST /v1/sandboxes/{id}/claim"}`: 2,
		`ctld_api_request_duration_seconds_count{route="POST /v1/sandboxes/{id}/exec"}`:  1,
		`ctld_api_failures_total{code="not_found",route="GET /v1/sandboxes/{id}"}`:       1,
	})
	if d := claimed[`ctld_journal_commit_duration_seconds_count`] - before[`ctld_journal_commit_duration_seconds_count`]; d < 2 {
		t.Errorf("journal commits during the claim: %v, want at least 2 (intent, ready)", d)
	}
	if claimed[`ctld_nft_duration_seconds_count{op="apply",result="ok"}`] < 1 {
		t.Errorf("no nft apply timed during the claim")
	}
	if s := claimed[`ctld_claim_step_duration_seconds_sum{step="total"}`]; s <= 0.1 {
		t.Errorf("claim total time %v s: want the guest's start in it", s)
	}

	if _, err := c.Release(cx, "m1", api.ReleaseRequest{OperationID: "release-m1", Generation: 1}); err != nil {
		t.Fatalf("release: %v", err)
	}
	released := e.metrics(t, "a")
	released.want(t, "after the release", map[string]float64{
		`ctld_generations{state="ready"}`:                        0,
		`ctld_generations{state="released"}`:                     1,
		`ctld_node_cpu_cores{pool="leased"}`:                     0,
		`ctld_node_memory_bytes{pool="leased"}`:                  0,
		`ctld_release_step_duration_seconds_count{step="total"}`: 1,
	})
	if released[`ctld_nft_duration_seconds_count{op="remove",result="ok"}`] < 1 {
		t.Errorf("no nft remove timed during the release")
	}

	t.Logf("takeover %.3fs; journal %d commits in %.3fs, %.0f bytes; claim total %.3fs (runsc %.3fs); release total %.3fs; series on the primary %d",
		released[`ctld_takeover_duration_seconds_sum`], int(released[`ctld_journal_commit_duration_seconds_count`]), released[`ctld_journal_commit_duration_seconds_sum`],
		released[`ctld_journal_size_bytes`], released[`ctld_claim_step_duration_seconds_sum{step="total"}`], released[`ctld_claim_step_duration_seconds_sum{step="runsc"}`],
		released[`ctld_release_step_duration_seconds_sum{step="total"}`], len(released))
	// The standby serves its role and the runtime, no node numbers.
	sb := e.metrics(t, "b")
	sb.want(t, "standby", map[string]float64{`ctld_role{role="standby",slot="b"}`: 1, `ctld_epoch{slot="b"}`: 0})
	for k := range sb {
		if strings.HasPrefix(k, "ctld_node_") || strings.HasPrefix(k, "ctld_generations") {
			t.Errorf("standby serves node series %s", k)
		}
	}
	if _, ok := sb["go_goroutines"]; !ok {
		t.Errorf("standby lacks the Go runtime's metrics")
	}

	// pprof on the debug socket; over TCP only /metrics.
	if code, body := e.debugGet(t, "a", "/debug/pprof/goroutine?debug=1"); code != 200 || !strings.Contains(body, "goroutine profile") {
		t.Errorf("pprof on the debug socket: %d %.200s", code, body)
	}
	hc := &http.Client{Timeout: 30 * time.Second}
	if code, body := httpGet(t, hc, "http://127.0.0.1:19464/metrics"); code != 200 || parseScrape(t, body)[`ctld_role{role="primary",slot="a"}`] != 1 {
		t.Errorf("TCP scrape of a: %d", code)
	}
	if code, body := httpGet(t, hc, "http://127.0.0.1:19465/metrics"); code != 200 || parseScrape(t, body)[`ctld_role{role="standby",slot="b"}`] != 1 {
		t.Errorf("TCP scrape of b: %d", code)
	}
	if code, _ := httpGet(t, hc, "http://127.0.0.1:19464/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("pprof over TCP: %d, want 404", code)
	}
}
