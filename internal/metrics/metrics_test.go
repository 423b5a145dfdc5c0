package metrics

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/ha"
)

type fakeNode struct {
	node api.Node
	list api.SandboxList
	err  error
}

func (f *fakeNode) Node(context.Context) (api.Node, error)        { return f.node, f.err }
func (f *fakeNode) List(context.Context) (api.SandboxList, error) { return f.list, f.err }

type fakeJournal int64

func (f fakeJournal) Size() (int64, error) { return int64(f), nil }

func testNode() *fakeNode {
	c := func(cpu, mem int64) api.Capacity {
		return api.Capacity{CPUMillis: cpu, MemoryBytes: mem, PIDs: 100, NBDDevices: 4, Addresses: 10, DiskBytes: 1 << 30}
	}
	return &fakeNode{
		node: api.Node{Capacity: api.NodeCapacity{Total: c(4000, 8<<30), Allocatable: c(3750, 7<<30), Leased: c(500, 256<<20), Withheld: c(250, 128<<20)},
			Withheld:  []api.WithheldLease{{SandboxID: "w", Generation: 2}},
			WarmPools: []api.WarmPool{{Template: "busybox", Idle: 2, Booting: 1, Hits: 7, Misses: 3}}},
		list: api.SandboxList{Sandboxes: []api.Sandbox{
			{ID: "r1", State: api.StateReady, OOMKills: 2, Writer: &api.BlockWriter{Restarts: 1}},
			{ID: "r2", State: api.StateReady, OOMKills: 1},
			{ID: "f", State: api.StateFailed, OOMKills: 5}, // not live: not counted
			{ID: "x", State: api.StateReleased},
		}},
	}
}

func newTest(t *testing.T) (*Metrics, *ha.Status) {
	st := &ha.Status{Slot: "a", Role: ha.RoleStandby, Health: "ok"}
	return New(prometheus.NewRegistry(), func() ha.Status { return *st }), st
}

// feed makes every instrument have a sample, so the lint sees them all.
func feed(m *Metrics) {
	m.ObserveRequest("POST /v1/sandboxes/{id}/claim", 200, "", 2*time.Second)
	m.ObserveRequest("", 403, errdefs.CodePermissionDenied, time.Millisecond)
	m.ObserveClaim(api.Sandbox{ID: "s", Generation: 1, Timings: api.Timings{AdmitMS: 2, LeaseMS: 3, TotalMS: 5000,
		Steps: []api.StepTiming{{Resource: "cgroup", MakeMS: 3}}}})
	m.ObserveRelease(api.Sandbox{ID: "s", Generation: 1, ReleaseTimings: &api.ReleaseTimings{ProofMS: 4, TotalMS: 90,
		Steps: []api.StepTiming{{Resource: "cgroup", RemoveMS: 20, CheckMS: 1}}}})
	m.ObserveTakeover(300 * time.Millisecond)
	m.ObserveCommit(2 * time.Millisecond)
	m.ObserveDNS(dns.RcodeSuccess, false)
	m.ObserveDNS(dns.RcodeRefused, false)
	m.ObserveDNS(dns.RcodeServerFailure, false)
	m.ObserveDNS(0, true)
	m.ObserveAllowed(3)
	m.ObserveNft("apply", 10*time.Millisecond, nil)
	m.ObserveNft("remove", time.Millisecond, errors.New("boom"))
}

// TestNamesLint: every metric, the node's included, passes promtool's
// lint rules (units in names, _total counters, help texts).
func TestNamesLint(t *testing.T) {
	m, _ := newTest(t)
	if _, err := m.ServeNode(testNode(), fakeJournal(1<<20)); err != nil {
		t.Fatal(err)
	}
	if _, err := m.ServeWriters(&fakeWriters{}); err != nil {
		t.Fatal(err)
	}
	feed(m)
	problems, err := testutil.GatherAndLint(m.Registry)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var ours int
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "ctld_") {
			ours++
		}
	}
	if ours != 29 {
		t.Errorf("%d ctld_ metric families, want 29 (docs/operations.md lists each: update both)", ours)
	}
}

// TestNodeCollector: the node's numbers are read at scrape time, only
// while ServeNode's collector is registered (a standby has none).
func TestNodeCollector(t *testing.T) {
	m, _ := newTest(t)
	n := testNode()
	if c := testutil.CollectAndCount(m.Registry, "ctld_node_cpu_cores"); c != 0 {
		t.Fatalf("standby has %d node series", c)
	}
	remove, err := m.ServeNode(n, fakeJournal(3<<20))
	if err != nil {
		t.Fatal(err)
	}
	want := `
# HELP ctld_node_cpu_cores CPU of the node's capacity ledger, by pool (total, allocatable = total - reserve, leased, warm, withheld).
# TYPE ctld_node_cpu_cores gauge
ctld_node_cpu_cores{pool="allocatable"} 3.75
ctld_node_cpu_cores{pool="leased"} 0.5
ctld_node_cpu_cores{pool="total"} 4
ctld_node_cpu_cores{pool="warm"} 0
ctld_node_cpu_cores{pool="withheld"} 0.25
# HELP ctld_generations Sandboxes by the state of their current generation (finished ones stay until the journal's retention prunes them).
# TYPE ctld_generations gauge
ctld_generations{state="claiming"} 0
ctld_generations{state="exited"} 0
ctld_generations{state="failed"} 1
ctld_generations{state="lost"} 0
ctld_generations{state="ready"} 2
ctld_generations{state="released"} 1
ctld_generations{state="releasing"} 0
# HELP ctld_withheld_generations Generations whose cleanup is unproven: their capacity is withheld.
# TYPE ctld_withheld_generations gauge
ctld_withheld_generations 1
# HELP ctld_ready_oom_kills memory.max OOM kills counted in the leases of the ready generations (a generation's count leaves with it).
# TYPE ctld_ready_oom_kills gauge
ctld_ready_oom_kills 3
# HELP ctld_ready_writer_restarts NBD writer restarts of the ready block-mode generations (a generation's count leaves with it).
# TYPE ctld_ready_writer_restarts gauge
ctld_ready_writer_restarts 1
# HELP ctld_warm_members Members of the node's warm pools now, by template and state (idle: ready to be taken; booting).
# TYPE ctld_warm_members gauge
ctld_warm_members{state="booting",template="busybox"} 1
ctld_warm_members{state="idle",template="busybox"} 2
# HELP ctld_warm_claims_total Claims of a warm pool's template since the primary's term began, by result (hit: a member made it ready; miss: made cold).
# TYPE ctld_warm_claims_total counter
ctld_warm_claims_total{result="hit",template="busybox"} 7
ctld_warm_claims_total{result="miss",template="busybox"} 3
# HELP ctld_journal_size_bytes Size of the journal's database file (bbolt grows it in steps, never shrinks it).
# TYPE ctld_journal_size_bytes gauge
ctld_journal_size_bytes 3.145728e+06
`
	names := []string{"ctld_node_cpu_cores", "ctld_generations", "ctld_withheld_generations", "ctld_ready_oom_kills", "ctld_ready_writer_restarts", "ctld_warm_members", "ctld_warm_claims_total", "ctld_journal_size_bytes"}
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
	if c := testutil.CollectAndCount(m.Registry, "ctld_node_memory_bytes", "ctld_node_pids", "ctld_node_disk_bytes", "ctld_node_nbd_devices", "ctld_node_addresses"); c != 25 {
		t.Errorf("%d capacity series of the other resources, want 5 x 5 pools", c)
	}
	// The values move with the node, read again at each scrape.
	n.list.Sandboxes = n.list.Sandboxes[1:]
	if v := seriesValue(t, m, "ctld_generations", "ready"); v != 1 {
		t.Errorf("after one ready left: ready %v, want 1", v)
	}
	// A node that cannot be read fails its own series, not the role's.
	n.err = errors.New("journal closed")
	if _, err := m.Registry.Gather(); err == nil || !strings.Contains(err.Error(), "journal closed") {
		t.Errorf("gather with a failing node: %v", err)
	}
	remove()
	if c := testutil.CollectAndCount(m.Registry, "ctld_node_cpu_cores", "ctld_generations"); c != 0 {
		t.Errorf("after the term: %d node series", c)
	}
}

// seriesValue is the value of the gauge or counter series of family name
// with a label of value label.
func seriesValue(t *testing.T, m *Metrics, name, label string) float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, s := range mf.GetMetric() {
			for _, lp := range s.GetLabel() {
				if lp.GetValue() != label {
					continue
				}
				if c := s.GetCounter(); c != nil {
					return c.GetValue()
				}
				return s.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no %s{%s}", name, label)
	return 0
}

// TestRole: the role series say the status of now.
func TestRole(t *testing.T) {
	m, st := newTest(t)
	if v := seriesValue(t, m, "ctld_role", "standby"); v != 1 {
		t.Fatalf("standby: role standby %v", v)
	}
	st.Role, st.Epoch = ha.RolePrimary, 7
	want := `
# HELP ctld_epoch Epoch of this instance's primary term (0: never primary).
# TYPE ctld_epoch gauge
ctld_epoch{slot="a"} 7
# HELP ctld_role 1 for the role this instance has now (standby, starting, primary, stopping), 0 for the others.
# TYPE ctld_role gauge
ctld_role{role="primary",slot="a"} 1
ctld_role{role="standby",slot="a"} 0
ctld_role{role="starting",slot="a"} 0
ctld_role{role="stopping",slot="a"} 0
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), "ctld_role", "ctld_epoch"); err != nil {
		t.Fatal(err)
	}
}

// TestTimingsOncePerGeneration: a replayed claim or release (the stored
// answer again) does not count its timings twice; a new generation does.
func TestTimingsOncePerGeneration(t *testing.T) {
	m, _ := newTest(t)
	s := api.Sandbox{ID: "s", Generation: 1, Timings: api.Timings{RunscMS: 4000, TotalMS: 5000, Steps: []api.StepTiming{{Resource: "nft", MakeMS: 7}}},
		ReleaseTimings: &api.ReleaseTimings{TotalMS: 80, Steps: []api.StepTiming{{Resource: "nft", RemoveMS: 5, CheckMS: 1}}}}
	m.ObserveClaim(s)
	m.ObserveClaim(s)
	m.ObserveRelease(s)
	m.ObserveRelease(s)
	s.Generation = 2
	m.ObserveClaim(s)
	if c := testutil.CollectAndCount(m.claimStep); c != 7 {
		t.Fatalf("claim step series: %d, want 7", c)
	}
	if got := histCount(t, m, "ctld_claim_step_duration_seconds", "runsc"); got != 2 {
		t.Errorf("runsc observations %d, want 2 (generations 1 and 2, not the replay)", got)
	}
	if got := histCount(t, m, "ctld_release_resource_duration_seconds", "nft", "remove"); got != 1 {
		t.Errorf("nft remove observations %d, want 1", got)
	}
}

// histCount is the sample count of histogram name's series whose label
// values are exactly values.
func histCount(t *testing.T, m *Metrics, name string, values ...string) uint64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, s := range mf.GetMetric() {
			for _, lp := range s.GetLabel() {
				if !slices.Contains(values, lp.GetValue()) {
					continue series
				}
			}
			return s.GetHistogram().GetSampleCount()
		}
	}
	return 0
}

// TestListenAddr: a slot's own entry wins over a bare address.
func TestListenAddr(t *testing.T) {
	for _, c := range []struct {
		in         []string
		slot, want string
		err        bool
	}{
		{nil, "a", "", false},
		{[]string{"127.0.0.1:9464"}, "b", "127.0.0.1:9464", false},
		{[]string{"a=127.0.0.1:9464", "b=127.0.0.1:9465"}, "b", "127.0.0.1:9465", false},
		{[]string{"a=127.0.0.1:9464"}, "b", "", false},
		{[]string{":9400", "b=:9401"}, "a", ":9400", false},
		{[]string{"9464"}, "a", "", true},
		{[]string{"c=:9464"}, "a", "", true},
	} {
		got, err := ListenAddr(c.in, c.slot)
		if got != c.want || (err != nil) != c.err {
			t.Errorf("ListenAddr(%q, %s) = %q, %v; want %q, error %v", c.in, c.slot, got, err, c.want, c.err)
		}
	}
}

// TestServeOverUnixSocket: /metrics and pprof over a real socket with a
// real client; the TCP handler has no pprof.
func TestServeOverUnixSocket(t *testing.T) {
	m, _ := newTest(t)
	feed(m)
	sock := filepath.Join(t.TempDir(), "debug.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	log := slog.New(slog.DiscardHandler)
	go func() { done <- Serve(ctx, ln, m.Handler(log, true), log) }()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	get := func(path string) (int, string) {
		resp, err := hc.Get("http://ctld" + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, `ctld_api_failures_total{code="permission_denied",route="none"} 1`) ||
		!strings.Contains(body, "go_goroutines") || !strings.Contains(body, `ctld_dns_queries_total{outcome="refused"} 1`) {
		t.Errorf("/metrics: %d\n%s", code, body)
	}
	if code, body := get("/debug/pprof/goroutine?debug=1"); code != 200 || !strings.Contains(body, "goroutine profile") {
		t.Errorf("pprof goroutine: %d %.200s", code, body)
	}
	tcp := m.Handler(log, false)
	rec := httptest.NewRecorder()
	tcp.ServeHTTP(rec, httptest.NewRequest("GET", "/debug/pprof/", nil))
	if rec.Code != 404 {
		t.Errorf("pprof on the TCP handler: %d, want 404", rec.Code)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve: %v", err)
	}
}
