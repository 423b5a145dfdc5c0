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
	d.Disk = n.diskUsed // overlay: project quota; block: dirty file (usage_disk.go)
	return meter.New(d, meter.Retention{MaxAge: n.cfg.UsageRetention, Keep: n.cfg.UsageKeep})
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

// meterFinal samples rec's totals for its final usage record and
// journals it (once per generation), before the teardown removes
// anything. It returns the sample (nil: a generation without a lease has
// none): if this write failed, the teardown's proof transaction writes
// the record from it, so the capacity never returns without it (fail
// closed: no proof, no final record, no capacity).
func (n *Node) meterFinal(ctx context.Context, rec journal.Sandbox) *meter.FinalSample {
	if rec.LeaseID == "" {
		return nil
	}
	f := n.meter.SampleFinal(ctx, rec)
	if err := n.d.Journal.Update(func(tx *journal.Tx) error { return n.meter.FinalLocked(tx, rec, f) }); err != nil {
		n.log.Error("final usage record not journaled yet; the cleanup proof waits for it", "sandbox", rec.ID, "generation", rec.Generation, "err", err)
	}
	return &f
}

// meterFinalLocked writes the final record from f in the transaction
// that ends the generation, unless written before (nil f: none).
func (n *Node) meterFinalLocked(tx *journal.Tx, rec journal.Sandbox, f *meter.FinalSample) error {
	if f == nil {
		return nil
	}
	return n.meter.FinalLocked(tx, rec, *f)
}

// Usage reads at most limit records of the metering stream after the
// cursor (limit at most MaxUsagePage); ack: the reader stored the
// records up to the cursor, they may go.
func (n *Node) Usage(ctx context.Context, after uint64, limit int, ack bool) (journal.UsagePage, error) {
	if limit <= 0 || limit > MaxUsagePage {
		return journal.UsagePage{}, errdefs.Errorf(errdefs.CodeInvalidArgument, "limit %d out of range 1..%d", limit, MaxUsagePage)
	}
	if ack {
		// The acknowledgement is a journal write: only within the term.
		_, end, err := n.begin(ctx)
		if err != nil {
			return journal.UsagePage{}, err
		}
		defer end()
	}
	p, err := n.meter.Page(after, limit, ack)
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
