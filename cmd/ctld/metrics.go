package main

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/ctld/ctld/internal/metrics"
	"github.com/ctld/ctld/internal/netpolicy"
	"github.com/ctld/ctld/internal/netpolicy/nft"
	"github.com/ctld/ctld/internal/writer"
)

// timedFirewall is the nft Firewall with its transactions that a claim,
// a release and the DNS proxy wait for timed (ctld_nft_duration_seconds)
// and the addresses the proxy allows counted: metrics at the edge, the
// firewall itself unchanged.
type timedFirewall struct {
	*nft.Firewall
	m *metrics.Metrics
}

func (f timedFirewall) Apply(ctx context.Context, o netpolicy.Owner, eff netpolicy.Effective) error {
	start := time.Now()
	err := f.Firewall.Apply(ctx, o, eff)
	f.m.ObserveNft("apply", time.Since(start), err)
	return err
}

func (f timedFirewall) Remove(ctx context.Context, o netpolicy.Owner) error {
	start := time.Now()
	err := f.Firewall.Remove(ctx, o)
	f.m.ObserveNft("remove", time.Since(start), err)
	return err
}

func (f timedFirewall) AllowResolved(ctx context.Context, o netpolicy.Owner, set int, addrs []netip.Addr, ttl time.Duration) error {
	start := time.Now()
	err := f.Firewall.AllowResolved(ctx, o, set, addrs, ttl)
	f.m.ObserveNft("allow_resolved", time.Since(start), err)
	if err == nil {
		f.m.ObserveAllowed(len(addrs))
	}
	return err
}

// writerCounts reads the block writers' NBD error counts for
// ctld_nbd_errors_total (writer.Supervisor.AllStats).
type writerCounts struct{ sup *writer.Supervisor }

func (w writerCounts) WriterCounts(ctx context.Context) ([]metrics.WriterCounts, error) {
	all, err := w.sup.AllStats(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]metrics.WriterCounts, 0, len(all))
	for _, d := range all {
		c := metrics.WriterCounts{Dir: d.Dir, Err: d.Err}
		if d.Err == nil {
			c.Writer = fmt.Sprintf("pid %d epoch %d", d.Stats.PID, d.Stats.Epoch)
			c.Counts = d.Stats.NBDErrors.ByKind()
			c.Counts["reconnect"] = d.Stats.Reconnects
		}
		out = append(out, c)
	}
	return out, nil
}
