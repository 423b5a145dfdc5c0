package meter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/logging"
	"github.com/ctld/ctld/internal/netpolicy"
)

// Defaults of Config.
const (
	// DefaultMaxAge is how long a record nobody acknowledged stays: the
	// manager's puller stores and acknowledges records within seconds
	// (then they go), so this is the manager outage the stream survives
	// without a gap. At a 1 m interval, a week of 100 live generations is
	// about 1,000,000 records (about 0.86 GB of journal: TestUsageJournalSize
	// in internal/journal measures 86 MB for 100,000).
	DefaultMaxAge = 7 * 24 * time.Hour
	// trimBatch bounds one trimming transaction.
	trimBatch = 1024
)

// Deps are what the meter reads. Each source may be absent (nil), and
// then its fields read zero.
type Deps struct {
	Journal *journal.Journal
	Epoch   uint64
	// CgroupDir is a lease's cgroup directory ("" for a bad id).
	CgroupDir func(leaseID string) string
	// Egress reads the counters of the generation's nft chain (ok false:
	// no sandbox network, or none now).
	Egress func(ctx context.Context, s journal.Sandbox) (netpolicy.Counters, bool)
	// Disk reads the bytes the generation's root holds on the node (the
	// project quota's usage of an overlay scratch dir).
	Disk func(ctx context.Context, s journal.Sandbox) (uint64, bool)
	Now  func() time.Time
	Log  *slog.Logger
}

// Meter samples generations and journals their records.
type Meter struct {
	d     Deps
	ret   Retention
	ticks int // Tick prunes marks every markPruneTicks
}

// Retention is which records the journal drops, besides those a reader
// acknowledged (docs/operations.md, Usage metering).
type Retention struct {
	// MaxAge: an unacknowledged record whose period ended longer ago
	// goes (0: DefaultMaxAge).
	MaxAge time.Duration
	// Keep > 0 bounds the records kept, read or not: a disk bound that
	// drops unread records (0: none).
	Keep int
}

// markPruneTicks: the marks of ended generations are forgotten every this
// many ticks (their number grows with the journal's history, not with
// the live generations).
const markPruneTicks = 60

// New builds a meter with retention r.
func New(d Deps, r Retention) *Meter {
	if d.Now == nil {
		d.Now = time.Now
	}
	d.Log = logging.OrDiscard(d.Log)
	if r.MaxAge <= 0 {
		r.MaxAge = DefaultMaxAge
	}
	r.Keep = max(r.Keep, 0)
	return &Meter{d: d, ret: r}
}

// retention is what TrimUsage may drop now.
func (m *Meter) retention(now time.Time) journal.UsageRetention {
	return journal.UsageRetention{Before: now.Add(-m.ret.MaxAge), Keep: m.ret.Keep}
}

// ReadyAt is when generation s was published ready (zero: never): its
// claim's start plus the claim's total time.
func ReadyAt(s journal.Sandbox) time.Time {
	if s.Timings.ProofMS <= 0 || s.CreatedAt.IsZero() {
		return time.Time{}
	}
	return s.CreatedAt.Add(time.Duration(s.Timings.TotalMS * float64(time.Millisecond)))
}

// Sample is generation s's totals now. A cgroup that is gone is an
// error wrapping fs.ErrNotExist.
func (m *Meter) Sample(ctx context.Context, s journal.Sandbox, now time.Time) (journal.Usage, error) {
	var u journal.Usage
	if r := ReadyAt(s); !r.IsZero() && now.After(r) {
		u.WallMS = uint64(now.Sub(r) / time.Millisecond)
	}
	var err error
	if m.d.CgroupDir != nil {
		var c Cgroup
		c, err = ReadCgroup(m.d.CgroupDir(s.LeaseID))
		u.CPUUsec, u.MemoryCurrentBytes, u.MemoryPeakBytes = c.CPUUsec, c.MemoryCurrentBytes, c.MemoryPeakBytes
		u.PIDsPeak, u.IOReadBytes, u.IOWriteBytes = c.PIDsPeak, c.IOReadBytes, c.IOWriteBytes
		// A kernel without memory.peak: the current level is a floor.
		u.MemoryPeakBytes = max(u.MemoryPeakBytes, u.MemoryCurrentBytes)
	}
	if m.d.Egress != nil {
		if c, ok := m.d.Egress(ctx, s); ok {
			u.TxBytes, u.TxPackets, u.DroppedPackets = c.TxBytes, c.TxPackets, c.DroppedPackets
		}
	}
	if m.d.Disk != nil {
		if b, ok := m.d.Disk(ctx, s); ok {
			u.DiskUsedBytes = b
		}
	}
	return u, err
}

// Delta is the record that follows totals prev with totals cur: the
// counters' growth (a counter below its previous total was reset, and
// counts from zero), the levels as cur has them, the peaks never below
// prev's.
func Delta(prev, cur journal.Usage) journal.Usage {
	d := func(p, c uint64) uint64 {
		if c < p {
			return c
		}
		return c - p
	}
	return journal.Usage{
		CPUUsec:            d(prev.CPUUsec, cur.CPUUsec),
		IOReadBytes:        d(prev.IOReadBytes, cur.IOReadBytes),
		IOWriteBytes:       d(prev.IOWriteBytes, cur.IOWriteBytes),
		TxBytes:            d(prev.TxBytes, cur.TxBytes),
		TxPackets:          d(prev.TxPackets, cur.TxPackets),
		DroppedPackets:     d(prev.DroppedPackets, cur.DroppedPackets),
		WallMS:             d(prev.WallMS, cur.WallMS),
		MemoryCurrentBytes: cur.MemoryCurrentBytes,
		MemoryPeakBytes:    max(prev.MemoryPeakBytes, cur.MemoryPeakBytes),
		PIDsPeak:           max(prev.PIDsPeak, cur.PIDsPeak),
		DiskUsedBytes:      cur.DiskUsedBytes,
	}
}

// floor keeps the counters and peaks of a sample from going below what
// the stream already said (a source read as zero because it is gone).
func floor(prev, cur journal.Usage) journal.Usage {
	cur.CPUUsec = max(cur.CPUUsec, prev.CPUUsec)
	cur.IOReadBytes = max(cur.IOReadBytes, prev.IOReadBytes)
	cur.IOWriteBytes = max(cur.IOWriteBytes, prev.IOWriteBytes)
	cur.TxBytes = max(cur.TxBytes, prev.TxBytes)
	cur.TxPackets = max(cur.TxPackets, prev.TxPackets)
	cur.DroppedPackets = max(cur.DroppedPackets, prev.DroppedPackets)
	cur.WallMS = max(cur.WallMS, prev.WallMS)
	cur.MemoryPeakBytes = max(cur.MemoryPeakBytes, prev.MemoryPeakBytes)
	cur.PIDsPeak = max(cur.PIDsPeak, prev.PIDsPeak)
	return cur
}

// appendLocked writes the record of s with totals cur in tx and moves its
// mark; it writes nothing for a generation whose final record exists.
func (m *Meter) appendLocked(tx *journal.Tx, s journal.Sandbox, cur journal.Usage, now time.Time, final bool) (bool, error) {
	mark, ok, err := tx.UsageMark(s.ID, s.Generation)
	if err != nil {
		return false, err
	}
	if ok && mark.Final {
		return false, nil
	}
	start := mark.At
	if !ok {
		start = ReadyAt(s)
		if start.IsZero() {
			start = s.CreatedAt
		}
		mark = journal.UsageMark{SandboxID: s.ID, Generation: s.Generation}
	}
	if final {
		// What could not be read now (the source is gone) is what the
		// stream said last: a final record never takes usage back.
		cur = floor(mark.Total, cur)
	}
	rec := journal.UsageRecord{
		SandboxID: s.ID, Generation: s.Generation, Final: final, Epoch: m.d.Epoch,
		Start: start, End: now, Usage: Delta(mark.Total, cur),
	}
	if _, err := tx.AppendUsage(rec); err != nil {
		return false, err
	}
	mark.At, mark.Total, mark.Final = now, floor(mark.Total, cur), final
	return true, tx.PutUsageMark(mark)
}

// FinalSample is generation s's totals read for its final record, and
// when.
type FinalSample struct {
	At    time.Time
	Usage journal.Usage
}

// SampleFinal reads generation s's totals for its final record. Call it
// before the teardown removes anything, so the cgroup and the counters
// are still there to read.
func (m *Meter) SampleFinal(ctx context.Context, s journal.Sandbox) FinalSample {
	now := m.d.Now().UTC()
	cur, err := m.Sample(ctx, s, now)
	if err != nil {
		m.d.Log.Warn("final usage sample incomplete; the last record's totals stand for what could not be read",
			"sandbox", s.ID, "generation", s.Generation, "err", err)
	}
	return FinalSample{At: now, Usage: cur}
}

// FinalLocked journals generation s's final record from f in tx, unless
// it was written (once: a teardown run again after a failover finds it).
func (m *Meter) FinalLocked(tx *journal.Tx, s journal.Sandbox, f FinalSample) error {
	if _, err := m.appendLocked(tx, s, f.Usage, f.At, true); err != nil {
		return fmt.Errorf("journal final usage of %s generation %d: %w", s.ID, s.Generation, err)
	}
	return nil
}

// Final samples generation s and journals its final record (SampleFinal,
// FinalLocked) in a transaction of its own.
func (m *Meter) Final(ctx context.Context, s journal.Sandbox) error {
	f := m.SampleFinal(ctx, s)
	return m.d.Journal.Update(func(tx *journal.Tx) error { return m.FinalLocked(tx, s, f) })
}

// Tick journals a record of every ready generation in one transaction,
// forgets the marks of generations that are over, and trims the stream.
// Ticks of one meter run one at a time.
func (m *Meter) Tick(ctx context.Context) error {
	var live []journal.Sandbox
	var marks []journal.UsageMark
	m.ticks++
	pruneMarks := m.ticks%markPruneTicks == 1
	err := m.d.Journal.View(func(tx *journal.Tx) error {
		all, err := tx.LiveSandboxes()
		if err != nil {
			return err
		}
		for _, s := range all {
			if s.State == journal.StateReady {
				live = append(live, s)
			}
		}
		if pruneMarks {
			marks, err = tx.UsageMarks()
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("read generations to meter: %w", err)
	}
	now := m.d.Now().UTC()
	samples := make([]journal.Usage, len(live))
	ok := make([]bool, len(live))
	for i, s := range live {
		u, err := m.Sample(ctx, s, now)
		if err != nil {
			// Gone under us (a teardown started): its final record says it.
			m.d.Log.Debug("usage sample skipped", "sandbox", s.ID, "generation", s.Generation, "err", err)
			continue
		}
		samples[i], ok[i] = u, true
	}
	err = m.d.Journal.Update(func(tx *journal.Tx) error {
		var errs []error
		for i, s := range live {
			if !ok[i] {
				continue
			}
			// Still ready now? A release may have begun since the read.
			cur, found, err := tx.Sandbox(s.ID)
			if err != nil {
				return err
			}
			if !found || cur.Generation != s.Generation || cur.State != journal.StateReady {
				continue
			}
			if _, err := m.appendLocked(tx, s, samples[i], now, false); err != nil {
				errs = append(errs, err)
			}
		}
		for _, mk := range marks {
			// A mark stays while its generation is the sandbox's current
			// one: the final mark guards against a second final record
			// (a withheld generation's teardown runs again; a failover
			// mid-teardown) and keeps the totals for the sandbox's view.
			s, found, err := tx.Sandbox(mk.SandboxID)
			if err != nil {
				return err
			}
			if !found || s.Generation > mk.Generation {
				if err := tx.DeleteUsageMark(mk.SandboxID, mk.Generation); err != nil {
					return err
				}
			}
		}
		if len(errs) > 0 {
			return errors.Join(errs...)
		}
		_, err := tx.TrimUsage(m.retention(now), trimBatch)
		return err
	})
	if err != nil {
		return fmt.Errorf("journal usage records: %w", err)
	}
	return nil
}

// Page reads at most limit records after the cursor. With ack, the
// reader says it stored every record up to the cursor: they go (in the
// same transaction, a batch of them; the next tick trims the rest).
func (m *Meter) Page(after uint64, limit int, ack bool) (journal.UsagePage, error) {
	var p journal.UsagePage
	read := func(tx *journal.Tx) (err error) {
		p, err = tx.UsageAfter(after, limit)
		return err
	}
	if !ack {
		return p, m.d.Journal.View(read)
	}
	// Only a cursor past the acknowledgement writes.
	if err := m.d.Journal.View(read); err != nil || after <= p.Acked || p.Acked >= p.Last {
		return p, err
	}
	err := m.d.Journal.Update(func(tx *journal.Tx) error {
		now := m.d.Now().UTC()
		if _, err := tx.AckUsage(after, now); err != nil {
			return err
		}
		if _, err := tx.TrimUsage(m.retention(now), trimBatch); err != nil {
			return err
		}
		return read(tx)
	})
	return p, err
}

// Live is generation s's totals now, for a sandbox's view: while it
// runs, a fresh sample; once over, the totals the stream ended with.
func (m *Meter) Live(ctx context.Context, s journal.Sandbox) (journal.Usage, bool) {
	if s.State == journal.StateReady {
		if u, err := m.Sample(ctx, s, m.d.Now().UTC()); err == nil {
			return u, true
		}
	}
	var mark journal.UsageMark
	var ok bool
	_ = m.d.Journal.View(func(tx *journal.Tx) (err error) {
		mark, ok, err = tx.UsageMark(s.ID, s.Generation)
		return err
	})
	return mark.Total, ok
}
