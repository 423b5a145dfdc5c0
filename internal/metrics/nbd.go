package metrics

import (
	"context"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// NBDErrorKinds are the kinds of ctld_nbd_errors_total: a block writer's
// requests answered with an error, by NBD command; requests refused
// before its backend; connections ended by an error; and dropped
// connections it re-attached.
var NBDErrorKinds = []string{"read", "write", "flush", "trim", "write_zeroes", "block_status", "refused", "connection", "reconnect"}

// WriterCounts is one running block writer's counts since it started, as
// read at a scrape.
type WriterCounts struct {
	// Dir is the writer's dir; Writer names the process (its pid and
	// epoch): a restarted writer counts from zero again.
	Dir, Writer string
	Counts      map[string]uint64
	// Err: the writer did not answer; its counts are read next time.
	Err error
}

// WriterSource reads the counts of the node's running writers
// (writer.Supervisor.AllStats, adapted in cmd/ctld).
type WriterSource interface {
	WriterCounts(ctx context.Context) ([]WriterCounts, error)
}

var (
	nbdErrDesc = prometheus.NewDesc("ctld_nbd_errors_total",
		"NBD errors of the node's block writers, by kind: requests a writer answered with an error, by command (read, write, flush, trim, write_zeroes, block_status), requests refused before its device (refused), connections ended by an error (connection), dropped kernel connections it re-attached (reconnect). Read from every writer at scrape time since this ctld started; what a writer counted after the last scrape before it died is not seen.",
		[]string{"kind"}, nil)
	unreadDesc = prometheus.NewDesc("ctld_writers_unread", "Running block writers that did not answer this scrape's request for their counts (read again at the next).", nil, nil)
)

// nbdTotals turns the writers' own counts (each from zero at the
// writer's start) into this process's counters: at each scrape it adds
// what each writer counted since the last one. It lives as long as the
// Metrics, across terms.
type nbdTotals struct {
	mu    sync.Mutex
	last  map[string]writerSeen // by dir
	total map[string]uint64     // by kind
}

type writerSeen struct {
	writer string
	counts map[string]uint64
}

// add takes one scrape's counts. A writer not listed is gone (forgotten);
// one that did not answer keeps its last counts, so nothing is counted
// twice.
func (n *nbdTotals) add(ws []WriterCounts) (unread int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.total == nil {
		n.total = map[string]uint64{}
	}
	next := make(map[string]writerSeen, len(ws))
	for _, w := range ws {
		prev, had := n.last[w.Dir]
		if w.Err != nil {
			unread++
			if had {
				next[w.Dir] = prev
			}
			continue
		}
		if !had || prev.writer != w.Writer {
			prev = writerSeen{} // a new writer: it counted from zero
		}
		for _, k := range NBDErrorKinds {
			cur, was := w.Counts[k], prev.counts[k]
			if cur >= was {
				n.total[k] += cur - was
			} else {
				n.total[k] += cur // never for one writer; counted from zero
			}
		}
		next[w.Dir] = writerSeen{writer: w.Writer, counts: w.Counts}
	}
	n.last = next
	return unread
}

func (n *nbdTotals) snapshot() map[string]uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make(map[string]uint64, len(n.total))
	for k, v := range n.total {
		out[k] = v
	}
	return out
}

type writerCollector struct {
	src    WriterSource
	totals *nbdTotals
}

func (c writerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- nbdErrDesc
	ch <- unreadDesc
}

func (c writerCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	ws, err := c.src.WriterCounts(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(unreadDesc, fmt.Errorf("read writers' counts: %w", err))
	} else {
		ch <- prometheus.MustNewConstMetric(unreadDesc, prometheus.GaugeValue, float64(c.totals.add(ws)))
	}
	total := c.totals.snapshot()
	for _, k := range NBDErrorKinds {
		ch <- prometheus.MustNewConstMetric(nbdErrDesc, prometheus.CounterValue, float64(total[k]), k)
	}
}

// ServeWriters adds the block writers' collector (ctld_nbd_errors_total,
// read from src at scrape time) until the returned function removes it,
// at the term's end. The totals carry over to the next term of this
// process.
func (m *Metrics) ServeWriters(src WriterSource) (remove func(), err error) {
	c := writerCollector{src: src, totals: &m.nbd}
	if err := m.Registry.Register(c); err != nil {
		return nil, fmt.Errorf("register writer metrics: %w", err)
	}
	return func() { m.Registry.Unregister(c) }, nil
}
