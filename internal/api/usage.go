package api

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Usage is what a runtime generation used. In a sandbox's view every
// field is the generation's total so far. In a usage record the counters
// (CPU, IO, egress, wall time) are what was used over the record's period
// and the levels (memory current, the peaks, disk used) are as they were
// at its end.
type Usage struct {
	CPUUsec            uint64 `json:"cpu_usec"`             // cpu.stat usage_usec
	MemoryCurrentBytes uint64 `json:"memory_current_bytes"` // memory.current
	MemoryPeakBytes    uint64 `json:"memory_peak_bytes"`    // memory.peak
	PIDsPeak           uint64 `json:"pids_peak"`            // pids.peak
	IOReadBytes        uint64 `json:"io_read_bytes"`        // io.stat rbytes
	IOWriteBytes       uint64 `json:"io_write_bytes"`       // io.stat wbytes
	DiskUsedBytes      uint64 `json:"disk_used_bytes"`      // overlay: the disk project's usage; block: the dirty file's allocated bytes
	TxBytes            uint64 `json:"tx_bytes"`             // egress the nft chain accepted
	TxPackets          uint64 `json:"tx_packets"`
	DroppedPackets     uint64 `json:"dropped_packets"`
	WallMS             uint64 `json:"wall_ms"` // from ready
}

// UsageRecord is one record of the metering stream (GET /v1/usage).
type UsageRecord struct {
	Seq        uint64    `json:"seq"`
	SandboxID  string    `json:"sandbox_id"`
	Generation uint64    `json:"generation"`
	Final      bool      `json:"final,omitempty"`
	Epoch      uint64    `json:"epoch"`
	Start      time.Time `json:"start"`
	End        time.Time `json:"end"`
	Usage      Usage     `json:"usage"`
}

// UsagePage answers GET /v1/usage?after=CURSOR&limit=N: the records with
// a sequence number above the cursor, in order. Next is the cursor of the
// following read. First is the oldest record the node still keeps (0:
// none); a cursor below First-1 missed the records its retention
// dropped. Last is the newest record ever written.
type UsagePage struct {
	Records []UsageRecord `json:"records"`
	Next    uint64        `json:"next"`
	First   uint64        `json:"first"`
	Last    uint64        `json:"last"`
}

// MaxUsageLimit bounds limit in GET /v1/usage.
const MaxUsageLimit = 1000

// UsageQuery is GET /v1/usage?after=CURSOR&limit=N&ack=true. With Ack
// the reader says it stored every record up to After: the node may drop
// them (its retention keeps unacknowledged records for its retention
// age).
type UsageQuery struct {
	After uint64
	Limit int
	Ack   bool
}

// ParseUsageQuery reads after, limit (default 100) and ack of GET
// /v1/usage.
func ParseUsageQuery(q url.Values) (UsageQuery, error) {
	out := UsageQuery{Limit: 100}
	if v := q.Get("after"); v != "" {
		after, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return UsageQuery{}, invalid("after %q: not a cursor (a sequence number)", v)
		}
		out.After = after
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxUsageLimit {
			return UsageQuery{}, invalid("limit %q: want 1..%d", v, MaxUsageLimit)
		}
		out.Limit = n
	}
	if v := q.Get("ack"); v != "" {
		ack, err := strconv.ParseBool(v)
		if err != nil {
			return UsageQuery{}, invalid("ack %q: want true or false", v)
		}
		out.Ack = ack
	}
	return out, nil
}

// Usage reads at most limit usage records after the cursor (and
// acknowledges nothing).
func (c *Client) Usage(ctx context.Context, after uint64, limit int) (UsagePage, error) {
	return c.usage(ctx, UsageQuery{After: after, Limit: limit})
}

// UsageAck reads at most limit usage records after the cursor and
// acknowledges the records up to it: call it with the cursor the caller
// stored (the manager's puller), so the node may drop them.
func (c *Client) UsageAck(ctx context.Context, after uint64, limit int) (UsagePage, error) {
	return c.usage(ctx, UsageQuery{After: after, Limit: limit, Ack: true})
}

func (c *Client) usage(ctx context.Context, uq UsageQuery) (UsagePage, error) {
	var out UsagePage
	q := url.Values{"after": {strconv.FormatUint(uq.After, 10)}, "limit": {strconv.Itoa(uq.Limit)}}
	if uq.Ack {
		q.Set("ack", "true")
	}
	if err := c.callQuery(ctx, http.MethodGet, "/v1/usage", q, nil, &out); err != nil {
		return out, fmt.Errorf("read usage after %d: %w", uq.After, err)
	}
	return out, nil
}
