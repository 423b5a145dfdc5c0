package journal

import (
	"encoding/binary"
	"fmt"
	"slices"
	"time"
)

// The metering stream (issue 22 §2): usage records of the generations,
// appended at a fixed interval and once at the end of each generation.
// A record's key is its sequence number, taken from the bucket's own
// durable sequence in the transaction that stores it, so the cursor is
// monotonic across restarts and failover (the standby opens this same
// journal): a committed record keeps its number, an aborted one never
// had one that a reader saw. Retention drops the oldest records only
// (TrimUsage), so the numbers a reader finds are contiguous from First.
//
// The buckets are made by the first write: a journal of an older ctld
// opens as it is.
var (
	bucketUsage      = []byte("usage")
	bucketUsageMarks = []byte("usage-marks")
	bucketUsageAck   = []byte("usage-ack")
)

const usageAckKey = "acked"

// UsageAck is how far a reader acknowledged the stream: it stored every
// record up to Through (so they may go).
type UsageAck struct {
	RecordVersion int       `json:"record_version,omitempty"`
	Through       uint64    `json:"through"`
	At            time.Time `json:"at"`
}

// Usage is what a generation used. In a record, the counters (CPU, IO,
// egress, wall time) are what was used over the record's period
// [Start, End]; the levels (memory current, the peaks, disk used) are as
// they were at End. Live (a sandbox's view) every field is the
// generation's total.
type Usage struct {
	CPUUsec            uint64 `json:"cpu_usec"`
	MemoryCurrentBytes uint64 `json:"memory_current_bytes"`
	MemoryPeakBytes    uint64 `json:"memory_peak_bytes"`
	PIDsPeak           uint64 `json:"pids_peak"`
	IOReadBytes        uint64 `json:"io_read_bytes"`
	IOWriteBytes       uint64 `json:"io_write_bytes"`
	DiskUsedBytes      uint64 `json:"disk_used_bytes"`
	TxBytes            uint64 `json:"tx_bytes"`
	TxPackets          uint64 `json:"tx_packets"`
	DroppedPackets     uint64 `json:"dropped_packets"`
	WallMS             uint64 `json:"wall_ms"`
}

// UsageRecord is one record of the metering stream.
type UsageRecord struct {
	RecordVersion int       `json:"record_version,omitempty"`
	Seq           uint64    `json:"seq"`
	SandboxID     string    `json:"sandbox_id"`
	Generation    uint64    `json:"generation"`
	Final         bool      `json:"final,omitempty"` // the generation's last record
	Epoch         uint64    `json:"epoch"`
	Start         time.Time `json:"start"`
	End           time.Time `json:"end"`
	Usage         Usage     `json:"usage"`
}

// UsageMark is what the stream last said of one generation: the totals
// the next record's counters are measured from, and whether its final
// record was written (then no other record of it is).
type UsageMark struct {
	RecordVersion int       `json:"record_version,omitempty"`
	SandboxID     string    `json:"sandbox_id"`
	Generation    uint64    `json:"generation"`
	At            time.Time `json:"at"`
	Total         Usage     `json:"total"`
	Final         bool      `json:"final,omitempty"`
}

func usageMarkKey(id string, gen uint64) string { return fmt.Sprintf("%s/%020d", id, gen) }

func seqKey(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

// AppendUsage stores r under the next sequence number and returns it.
func (t *Tx) AppendUsage(r UsageRecord) (uint64, error) {
	b, err := t.tx.CreateBucketIfNotExists(bucketUsage)
	if err != nil {
		return 0, fmt.Errorf("append usage record: %w", err)
	}
	seq, err := b.NextSequence()
	if err != nil {
		return 0, fmt.Errorf("append usage record: %w", err)
	}
	r.RecordVersion, r.Seq = RecordVersion, seq
	if err := put(t.tx, bucketUsage, string(seqKey(seq)), r); err != nil {
		return 0, fmt.Errorf("append usage record: %w", err)
	}
	return seq, nil
}

// UsageMark reads the mark of generation gen of sandbox id.
func (t *Tx) UsageMark(id string, gen uint64) (UsageMark, bool, error) {
	var m UsageMark
	if t.tx.Bucket(bucketUsageMarks) == nil {
		return m, false, nil
	}
	ok, err := get(t.tx, bucketUsageMarks, usageMarkKey(id, gen), &m)
	return m, ok, err
}

// PutUsageMark stores m.
func (t *Tx) PutUsageMark(m UsageMark) error {
	if _, err := t.tx.CreateBucketIfNotExists(bucketUsageMarks); err != nil {
		return fmt.Errorf("put usage mark: %w", err)
	}
	m.RecordVersion = RecordVersion
	return put(t.tx, bucketUsageMarks, usageMarkKey(m.SandboxID, m.Generation), m)
}

// DeleteUsageMark forgets a generation's mark.
func (t *Tx) DeleteUsageMark(id string, gen uint64) error {
	b := t.tx.Bucket(bucketUsageMarks)
	if b == nil {
		return nil
	}
	return b.Delete([]byte(usageMarkKey(id, gen)))
}

// UsageMarks lists every generation's mark.
func (t *Tx) UsageMarks() ([]UsageMark, error) {
	if t.tx.Bucket(bucketUsageMarks) == nil {
		return nil, nil
	}
	return all[UsageMark](t.tx, bucketUsageMarks)
}

// UsagePage is a read of the stream: Records after the cursor, in order.
// First is the oldest record still kept (0: none kept) and Last the
// newest ever written: a reader whose cursor is below First-1 missed
// the records retention dropped in between.
type UsagePage struct {
	Records []UsageRecord
	First   uint64
	Last    uint64
	Acked   uint64 // the highest acknowledged sequence number
}

// UsageAfter reads at most limit records with a sequence number above
// after.
func (t *Tx) UsageAfter(after uint64, limit int) (UsagePage, error) {
	var p UsagePage
	b := t.tx.Bucket(bucketUsage)
	if b == nil {
		return p, nil
	}
	p.Last = b.Sequence()
	a, err := t.usageAck()
	if err != nil {
		return p, err
	}
	p.Acked = a.Through
	c := b.Cursor()
	if k, _ := c.First(); k != nil {
		p.First = binary.BigEndian.Uint64(k)
	}
	for k, v := c.Seek(seqKey(after + 1)); k != nil && len(p.Records) < limit; k, v = c.Next() {
		var r UsageRecord
		if err := decode(bucketUsage, k, v, &r); err != nil {
			return p, err
		}
		p.Records = append(p.Records, r)
	}
	return p, nil
}

// usageAck reads the acknowledgement (zero: none yet).
func (t *Tx) usageAck() (UsageAck, error) {
	var a UsageAck
	if t.tx.Bucket(bucketUsageAck) == nil {
		return a, nil
	}
	_, err := get(t.tx, bucketUsageAck, usageAckKey, &a)
	return a, err
}

// AckUsage records that a reader stored every record up to through. The
// acknowledgement only moves up, and never past the newest record
// written (a reader cannot acknowledge what it was never given). It
// returns the acknowledgement now in force.
func (t *Tx) AckUsage(through uint64, at time.Time) (uint64, error) {
	b := t.tx.Bucket(bucketUsage)
	if b == nil {
		return 0, nil
	}
	a, err := t.usageAck()
	if err != nil {
		return 0, fmt.Errorf("acknowledge usage records: %w", err)
	}
	through = min(through, b.Sequence())
	if through <= a.Through {
		return a.Through, nil
	}
	if _, err := t.tx.CreateBucketIfNotExists(bucketUsageAck); err != nil {
		return 0, fmt.Errorf("acknowledge usage records: %w", err)
	}
	a = UsageAck{RecordVersion: RecordVersion, Through: through, At: at}
	if err := put(t.tx, bucketUsageAck, usageAckKey, a); err != nil {
		return 0, fmt.Errorf("acknowledge usage records: %w", err)
	}
	return through, nil
}

// UsageRetention says which records TrimUsage may drop: those a reader
// acknowledged, those whose period ended before Before (read or not;
// zero: none by age) and, with Keep > 0, the oldest beyond Keep records
// (a disk bound that drops unread records too; 0: none by count).
type UsageRetention struct {
	Before time.Time
	Keep   int
}

// TrimUsage deletes the oldest records that r lets go, at most batch of
// them in this transaction, stopping at the first one it keeps (so the
// kept numbers stay contiguous); it returns how many it deleted.
func (t *Tx) TrimUsage(r UsageRetention, batch int) (int, error) {
	b := t.tx.Bucket(bucketUsage)
	if b == nil {
		return 0, nil
	}
	a, err := t.usageAck()
	if err != nil {
		return 0, fmt.Errorf("trim usage records: %w", err)
	}
	c := b.Cursor()
	k, v := c.First()
	if k == nil {
		return 0, nil
	}
	// Keys are contiguous from the first kept one to the sequence.
	n := int(b.Sequence() - binary.BigEndian.Uint64(k) + 1)
	var keys [][]byte
	for ; k != nil && len(keys) < batch; k, v = c.Next() {
		if !usageDroppable(r, a, n-len(keys), k, v) {
			break
		}
		keys = append(keys, slices.Clone(k))
	}
	del := 0
	for _, k := range keys {
		if err := b.Delete(k); err != nil {
			return del, fmt.Errorf("trim usage records: %w", err)
		}
		del++
	}
	return del, nil
}

// usageDroppable: may record (k, v), the oldest of n kept, go?
func usageDroppable(r UsageRetention, a UsageAck, n int, k, v []byte) bool {
	if binary.BigEndian.Uint64(k) <= a.Through || (r.Keep > 0 && n > r.Keep) {
		return true
	}
	if r.Before.IsZero() {
		return false
	}
	var rec UsageRecord
	if err := decode(bucketUsage, k, v, &rec); err != nil {
		// Unreadable and never acknowledged: keep it (a reader sees the
		// decode error rather than a silent gap).
		return false
	}
	return rec.End.Before(r.Before)
}
