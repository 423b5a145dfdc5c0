// Package metrics is ctld's Prometheus instrumentation: the collectors on
// a registry it is given (never the global default), the observers the
// edges call (API requests, claim and release step timings, journal
// commits, takeovers, the DNS proxy, nft), the collectors that read the
// node's state at scrape time, and the debug handler that serves them
// with pprof. Names are ctld_*, with units in the name; docs/operations.md
// ("Metrics") lists every one.
package metrics

import (
	"log/slog"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/ha"
)

// Buckets of the latency histograms, in seconds: from a journal commit's
// milliseconds to a claim under emulation (seconds) and a long exec.
var latencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}

// Metrics are the instruments of one ctld process, on Registry.
type Metrics struct {
	Registry *prometheus.Registry

	apiDuration *prometheus.HistogramVec
	apiFailures *prometheus.CounterVec
	claimStep   *prometheus.HistogramVec
	claimRes    *prometheus.HistogramVec
	releaseStep *prometheus.HistogramVec
	releaseRes  *prometheus.HistogramVec
	takeover    prometheus.Histogram
	journal     prometheus.Histogram
	dnsQueries  *prometheus.CounterVec
	dnsAllowed  prometheus.Counter
	nftDuration *prometheus.HistogramVec
	// seen keeps a replayed claim or release (its stored answer) from
	// counting its timings twice.
	seen seen
	// nbd are the writers' NBD error totals (nbd.go).
	nbd nbdTotals
}

// New registers ctld's always-present instruments on reg (the Go runtime
// and process collectors, and the histograms and counters the edges
// feed) and returns them. status is the instance's role, read at scrape
// time.
func New(reg *prometheus.Registry, status func() ha.Status) *Metrics {
	m := &Metrics{
		Registry: reg,
		apiDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "ctld_api_request_duration_seconds", Help: "Time to answer an API request, by route (method and pattern; \"none\" when no route matched).",
			Buckets: latencyBuckets,
		}, []string{"route"}),
		apiFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ctld_api_failures_total", Help: "API requests answered with an error, by route and error code.",
		}, []string{"route", "code"}),
		claimStep: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "ctld_claim_step_duration_seconds", Help: "Time of each step of the claims that made a generation (the node's recorded timings).",
			Buckets: latencyBuckets,
		}, []string{"step"}),
		claimRes: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "ctld_claim_resource_duration_seconds", Help: "Time a claim took to make each resource of its generation.",
			Buckets: latencyBuckets,
		}, []string{"resource"}),
		releaseStep: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "ctld_release_step_duration_seconds", Help: "Time of the proof and the whole of each release's teardown (the node's recorded timings).",
			Buckets: latencyBuckets,
		}, []string{"step"}),
		releaseRes: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "ctld_release_resource_duration_seconds", Help: "Time a release took to remove (phase remove) and to check the removal of (phase check) each resource.",
			Buckets: latencyBuckets,
		}, []string{"resource", "phase"}),
		takeover: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "ctld_takeover_duration_seconds", Help: "Time from holding the primary lock to serving the API (journal, node build, reconcile).",
			Buckets: latencyBuckets,
		}),
		journal: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "ctld_journal_commit_duration_seconds", Help: "Time of each committed journal write transaction, fsync included; its count is the commits.",
			Buckets: latencyBuckets,
		}),
		dnsQueries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ctld_dns_queries_total", Help: "Queries the DNS proxy handled, by outcome.",
		}, []string{"outcome"}),
		dnsAllowed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ctld_dns_addresses_allowed_total", Help: "Resolved addresses the DNS proxy put into the sandboxes' nft domain sets.",
		}),
		nftDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "ctld_nft_duration_seconds", Help: "Time of the firewall's nft transactions, by operation and result.",
			Buckets: latencyBuckets,
		}, []string{"op", "result"}),
	}
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		roleCollector{status: status},
		m.apiDuration, m.apiFailures, m.claimStep, m.claimRes, m.releaseStep, m.releaseRes,
		m.takeover, m.journal, m.dnsQueries, m.dnsAllowed, m.nftDuration,
	)
	return m
}

// ObserveRequest is apiserver's RequestObserver.
func (m *Metrics) ObserveRequest(route string, _ int, code errdefs.Code, d time.Duration) {
	if route == "" {
		route = "none"
	}
	m.apiDuration.WithLabelValues(route).Observe(d.Seconds())
	if code != "" {
		m.apiFailures.WithLabelValues(route, string(code)).Inc()
	}
}

// ObserveTakeover records one takeover's duration.
func (m *Metrics) ObserveTakeover(d time.Duration) { m.takeover.Observe(d.Seconds()) }

// ObserveCommit records one journal commit (journal.Journal.OnCommit).
func (m *Metrics) ObserveCommit(d time.Duration) { m.journal.Observe(d.Seconds()) }

// ObserveDNS is the DNS proxy's Observe: one query by the rcode of its
// answer (REFUSED: by policy, an unknown source or the rate limit;
// SERVFAIL: an upstream, the address cap or nft failed; anything else is
// answered), or dropped over the in-flight bounds.
func (m *Metrics) ObserveDNS(rcode int, dropped bool) {
	outcome := "answered"
	switch {
	case dropped:
		outcome = "dropped"
	case rcode == dns.RcodeRefused:
		outcome = "refused"
	case rcode == dns.RcodeServerFailure:
		outcome = "failed"
	}
	m.dnsQueries.WithLabelValues(outcome).Inc()
}

// ObserveAllowed counts addresses the DNS proxy put into a domain set.
func (m *Metrics) ObserveAllowed(n int) { m.dnsAllowed.Add(float64(n)) }

// ObserveNft records one nft transaction of the firewall.
func (m *Metrics) ObserveNft(op string, d time.Duration, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.nftDuration.WithLabelValues(op, result).Observe(d.Seconds())
}

// Handler serves the metrics at /metrics and, with pprof, the runtime
// profiles at /debug/pprof/ (only for the root-only debug socket: a
// profile shows memory and arguments).
func (m *Metrics) Handler(log *slog.Logger, pprofToo bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		// A node that cannot be read still shows its role and runtime.
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: 4,
		Timeout:             30 * time.Second,
	}))
	if pprofToo {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}
