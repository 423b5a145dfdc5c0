package main

import (
	"context"
	"net/netip"
	"time"

	"github.com/ctld/ctld/internal/metrics"
	"github.com/ctld/ctld/internal/netpolicy"
	"github.com/ctld/ctld/internal/netpolicy/nft"
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
