package metrics

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ctld/ctld/internal/api"
)

// NodeSource is what the node collector reads at scrape time: the node's
// capacity ledger and withheld generations, and its sandboxes (the API's
// own answers, so the numbers are those a client sees). apiserver.Adapter
// is one.
type NodeSource interface {
	Node(ctx context.Context) (api.Node, error)
	List(ctx context.Context) (api.SandboxList, error)
}

// JournalSource is the primary's journal: its size.
type JournalSource interface {
	Size() (int64, error)
}

// scrapeTimeout bounds one read of the node at scrape time.
const scrapeTimeout = 10 * time.Second

var (
	poolLabels  = []string{"pool"}
	cpuDesc     = prometheus.NewDesc("ctld_node_cpu_cores", "CPU of the node's capacity ledger, by pool (total, allocatable = total - reserve, leased, warm, withheld).", poolLabels, nil)
	memDesc     = prometheus.NewDesc("ctld_node_memory_bytes", "Memory of the node's capacity ledger, by pool.", poolLabels, nil)
	pidsDesc    = prometheus.NewDesc("ctld_node_pids", "PIDs of the node's capacity ledger, by pool.", poolLabels, nil)
	diskDesc    = prometheus.NewDesc("ctld_node_disk_bytes", "Scratch disk of the node's capacity ledger, by pool.", poolLabels, nil)
	nbdDesc     = prometheus.NewDesc("ctld_node_nbd_devices", "NBD devices of the node's capacity ledger, by pool.", poolLabels, nil)
	addrDesc    = prometheus.NewDesc("ctld_node_addresses", "Sandbox addresses of the node's capacity ledger, by pool.", poolLabels, nil)
	genDesc     = prometheus.NewDesc("ctld_generations", "Sandboxes by the state of their current generation (finished ones stay until the journal's retention prunes them).", []string{"state"}, nil)
	withDesc    = prometheus.NewDesc("ctld_withheld_generations", "Generations whose cleanup is unproven: their capacity is withheld.", nil, nil)
	oomDesc     = prometheus.NewDesc("ctld_ready_oom_kills", "memory.max OOM kills counted in the leases of the ready generations (a generation's count leaves with it).", nil, nil)
	restartDesc = prometheus.NewDesc("ctld_ready_writer_restarts", "NBD writer restarts of the ready block-mode generations (a generation's count leaves with it).", nil, nil)
	warmMemDesc = prometheus.NewDesc("ctld_warm_members", "Members of the node's warm pools now, by template and state (idle: ready to be taken; booting).", []string{"template", "state"}, nil)
	warmClmDesc = prometheus.NewDesc("ctld_warm_claims_total", "Claims of a warm pool's template since the primary's term began, by result (hit: a member made it ready; miss: made cold).", []string{"template", "result"}, nil)
	jsizeDesc   = prometheus.NewDesc("ctld_journal_size_bytes", "Size of the journal's database file (bbolt grows it in steps, never shrinks it).", nil, nil)
)

// states are every state of a sandbox, so each series exists at 0.
var states = []api.SandboxState{api.StateClaiming, api.StateReady, api.StateReleasing, api.StateReleased, api.StateFailed, api.StateLost, api.StateExited}

type nodeCollector struct {
	node    NodeSource
	journal JournalSource
}

func (c nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{cpuDesc, memDesc, pidsDesc, diskDesc, nbdDesc, addrDesc, genDesc, withDesc, oomDesc, restartDesc, warmMemDesc, warmClmDesc, jsizeDesc} {
		ch <- d
	}
}

func (c nodeCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	if n, err := c.node.Node(ctx); err != nil {
		ch <- prometheus.NewInvalidMetric(cpuDesc, fmt.Errorf("read node: %w", err))
	} else {
		pools := []struct {
			name string
			c    api.Capacity
		}{{"total", n.Capacity.Total}, {"allocatable", n.Capacity.Allocatable}, {"leased", n.Capacity.Leased}, {"warm", n.Capacity.Warm}, {"withheld", n.Capacity.Withheld}}
		for _, p := range pools {
			gauge(cpuDesc, float64(p.c.CPUMillis)/1000, p.name)
			gauge(memDesc, float64(p.c.MemoryBytes), p.name)
			gauge(pidsDesc, float64(p.c.PIDs), p.name)
			gauge(diskDesc, float64(p.c.DiskBytes), p.name)
			gauge(nbdDesc, float64(p.c.NBDDevices), p.name)
			gauge(addrDesc, float64(p.c.Addresses), p.name)
		}
		gauge(withDesc, float64(len(n.Withheld)))
		for _, p := range n.WarmPools {
			gauge(warmMemDesc, float64(p.Idle), p.Template, "idle")
			gauge(warmMemDesc, float64(p.Booting), p.Template, "booting")
			ch <- prometheus.MustNewConstMetric(warmClmDesc, prometheus.CounterValue, float64(p.Hits), p.Template, "hit")
			ch <- prometheus.MustNewConstMetric(warmClmDesc, prometheus.CounterValue, float64(p.Misses), p.Template, "miss")
		}
	}
	if l, err := c.node.List(ctx); err != nil {
		ch <- prometheus.NewInvalidMetric(genDesc, fmt.Errorf("list sandboxes: %w", err))
	} else {
		count := map[api.SandboxState]int{}
		var ooms, restarts int64
		for _, s := range l.Sandboxes {
			count[s.State]++
			if s.State != api.StateReady {
				continue
			}
			ooms += s.OOMKills
			if s.Writer != nil {
				restarts += int64(s.Writer.Restarts)
			}
		}
		for _, st := range states {
			gauge(genDesc, float64(count[st]), string(st))
			delete(count, st)
		}
		for st, n := range count { // a state this build does not list
			gauge(genDesc, float64(n), string(st))
		}
		gauge(oomDesc, float64(ooms))
		gauge(restartDesc, float64(restarts))
	}
	if c.journal != nil {
		if size, err := c.journal.Size(); err != nil {
			ch <- prometheus.NewInvalidMetric(jsizeDesc, err)
		} else {
			gauge(jsizeDesc, float64(size))
		}
	}
}

// ServeNode adds the primary's node collector (read at scrape time from
// n and j) until the returned function removes it, at the term's end: a
// standby serves no node numbers.
func (m *Metrics) ServeNode(n NodeSource, j JournalSource) (remove func(), err error) {
	c := nodeCollector{node: n, journal: j}
	if err := m.Registry.Register(c); err != nil {
		return nil, fmt.Errorf("register node metrics: %w", err)
	}
	return func() { m.Registry.Unregister(c) }, nil
}
