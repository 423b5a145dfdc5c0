package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/names"
	"github.com/ctld/ctld/internal/node"
	"github.com/ctld/ctld/internal/node/warm"
)

// warmOpts are the warm pool's settings (--warm-pool*; ctld.toml keys of
// the same names).
type warmOpts struct {
	sizes       warmPoolFlag
	budget      int
	maxAge      time.Duration
	refillEvery time.Duration
}

// Bounds of the pool's settings: a member lives long enough to be worth
// its boot, and refills are at least this far apart.
const (
	minWarmMaxAge = time.Minute
	minWarmRefill = 10 * time.Millisecond
	maxWarmBudget = 1000
)

func warmFlags(f *pflag.FlagSet, o *warmOpts) {
	f.Var(&o.sizes, "warm-pool", "TEMPLATE=N: keep N warm members (guests booted ahead with no workload) of overlay template TEMPLATE, so a matching claim costs one agent round trip; repeatable; their capacity is the ledger's warm row; 0 or unset: none (docs/operations.md \"Warm pool\")")
	f.IntVar(&o.budget, "warm-pool-budget", 0, "the most warm members of all templates together, booting and idle (each holds a member's limits in the ledger's warm row); 0: the sum of the --warm-pool sizes")
	f.DurationVar(&o.maxAge, "warm-pool-max-age", warm.DefaultMaxAge, "an idle warm member older than this is destroyed (with a cleanup proof) and replaced, so a new template generation reaches the pool")
	f.DurationVar(&o.refillEvery, "warm-pool-refill-every", node.DefaultWarmRefill, "the least time between two warm member boots (one boots at a time): a drained pool refills at most this fast")
}

func (o warmOpts) check() error {
	if o.budget < 0 || o.budget > maxWarmBudget {
		return fmt.Errorf("--warm-pool-budget must be between 0 and %d, got %d", maxWarmBudget, o.budget)
	}
	if o.maxAge < minWarmMaxAge {
		return fmt.Errorf("--warm-pool-max-age must be at least %v, got %v", minWarmMaxAge, o.maxAge)
	}
	if o.refillEvery < minWarmRefill {
		return fmt.Errorf("--warm-pool-refill-every must be at least %v, got %v", minWarmRefill, o.refillEvery)
	}
	return nil
}

// settings are the node's warm.Settings.
func (o warmOpts) settings() warm.Settings {
	return warm.Settings{Sizes: o.sizes.sizes, Budget: o.budget, MaxAge: o.maxAge, RefillEvery: o.refillEvery}
}

// warmPoolFlag is --warm-pool TEMPLATE=N, repeatable: the warm members
// kept per template.
type warmPoolFlag struct {
	sizes map[string]int
}

func (f *warmPoolFlag) String() string {
	if f == nil || len(f.sizes) == 0 {
		return ""
	}
	var out []string
	for t, n := range f.sizes {
		out = append(out, fmt.Sprintf("%s=%d", t, n))
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}

// Set takes TEMPLATE=N, or several comma-separated (String's form, so
// the config file round-trips); "" sets nothing.
func (f *warmPoolFlag) Set(v string) error {
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			if err := f.set(p); err != nil {
				return err
			}
		}
	}
	return nil
}

func (f *warmPoolFlag) set(v string) error {
	tpl, num, ok := strings.Cut(v, "=")
	if !ok {
		return fmt.Errorf("want TEMPLATE=N, got %q", v)
	}
	if err := names.CheckID("template", tpl); err != nil {
		return err
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 0 || n > 1000 {
		return fmt.Errorf("pool size of %s: want 0..1000, got %q", tpl, num)
	}
	if f.sizes == nil {
		f.sizes = map[string]int{}
	}
	f.sizes[tpl] = n
	return nil
}

func (f *warmPoolFlag) Type() string { return "TEMPLATE=N" }

// statusWarm is the warm pools `ctld status` shows beside the slots:
// the primary's GET /v1/node warm_pools on the API socket in runDir,
// bounded by probeTimeout.
type statusWarm struct {
	Pools []api.WarmPool `json:"warm_pools,omitempty"`
	Error string         `json:"warm_pools_error,omitempty"`
}

func readStatusWarm(ctx context.Context, runDir string) statusWarm {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	sock := apiSocketPath(runDir)
	nd, err := (&api.Client{SocketPath: sock}).Node(ctx)
	if err != nil {
		return statusWarm{Error: fmt.Sprintf("no answer on %s within %s: %v", sock, probeTimeout, err)}
	}
	return statusWarm{Pools: nd.WarmPools}
}

// print writes one line per pool: members now, claims since the term
// began, and the hit rate ("-" before any claim of the pool).
func (s statusWarm) print(w io.Writer) {
	if s.Error != "" {
		fmt.Fprintf(w, "warm pools: %s\n", s.Error)
		return
	}
	for _, p := range s.Pools {
		rate := "-"
		if st := (warm.Stats{Hits: p.Hits, Misses: p.Misses}); p.Hits+p.Misses > 0 {
			rate = fmt.Sprintf("%.0f%%", 100*st.HitRate())
		}
		fmt.Fprintf(w, "warm pool %s  idle %d  booting %d  hits %d  misses %d  hit rate %s\n", p.Template, p.Idle, p.Booting, p.Hits, p.Misses, rate)
	}
}
