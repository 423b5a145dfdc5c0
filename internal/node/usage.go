package node

import (
	"context"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/meter"
)

// Usage metering (issue 22 §2; internal/node/meter): a record of every
// ready generation every Config.UsageInterval, and a final record as each
// teardown begins, before anything of the generation is removed, so
// before its capacity can come back.

// MaxUsagePage bounds the records of one read of the stream.
const MaxUsagePage = 1000

func (n *Node) newMeter() *meter.Meter {
	d := meter.Deps{
		Journal: n.d.Journal, Epoch: n.d.Epoch, Log: n.log,
		Egress: n.net.Counters,
	}
	if n.d.Guest.Leases != nil {
		d.CgroupDir = n.d.Guest.Leases.Dir
	}
	if n.d.Overlay.RootFS != nil {
		d.Disk = func(ctx context.Context, s journal.Sandbox) (uint64, bool) {
			if s.DiskProject == 0 {
				return 0, false
			}
			qs, err := n.d.Overlay.RootFS.DiskProjects(ctx, s.DiskProject, s.DiskProject)
			if err != nil || len(qs) != 1 {
				return 0, false
			}
			return qs[0].UsedBytes, true
		}
	}
	return meter.New(d, n.cfg.UsageKeep)
}

// MeterUsage journals a usage record of every ready generation every
// `every` until ctx ends (run it beside the API; 0: off). Each pass is an
// operation of the term, so the drain waits for it.
func (n *Node) MeterUsage(ctx context.Context, every time.Duration) {
	if every <= 0 {
		return
	}
	n.everyTick(ctx, every, func() {
		tctx, end, err := n.begin(ctx)
		if err != nil {
			return
		}
		defer end()
		if err := n.meter.Tick(tctx); err != nil {
			n.log.Error("meter usage", "err", err)
		}
	})
}

// meterFinal journals rec's final usage record (once per generation). A
// failure is logged, not fatal: the teardown and its proof go on.
func (n *Node) meterFinal(ctx context.Context, rec journal.Sandbox) {
	if rec.LeaseID == "" {
		return
	}
	if err := n.meter.Final(ctx, rec); err != nil {
		n.log.Error("final usage record not journaled", "sandbox", rec.ID, "generation", rec.Generation, "err", err)
	}
}

// Usage reads at most limit records of the metering stream after the
// cursor (limit at most MaxUsagePage).
func (n *Node) Usage(ctx context.Context, after uint64, limit int) (journal.UsagePage, error) {
	if limit <= 0 || limit > MaxUsagePage {
		return journal.UsagePage{}, errdefs.Errorf(errdefs.CodeInvalidArgument, "limit %d out of range 1..%d", limit, MaxUsagePage)
	}
	p, err := n.meter.Page(after, limit)
	if err != nil {
		return p, errdefs.Errorf(errdefs.CodeInternal, "read usage records: %v", err)
	}
	return p, nil
}

// liveUsage is a generation's totals for its view (nil: none known).
func (n *Node) liveUsage(ctx context.Context, s journal.Sandbox) *journal.Usage {
	if u, ok := n.meter.Live(ctx, s); ok {
		return &u
	}
	return nil
}
