package fakenode

import (
	"context"

	"github.com/ctld/ctld/internal/api"
)

// AddUsage appends a record to the node's metering stream, numbered next.
func (n *Node) AddUsage(r api.UsageRecord) api.UsageRecord {
	n.mu.Lock()
	defer n.mu.Unlock()
	r.Seq = uint64(len(n.usage) + 1)
	n.usage = append(n.usage, r)
	return r
}

// UsageAcked is the highest cursor a reader acknowledged.
func (n *Node) UsageAcked() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.usageAcked
}

// usageServer serves the node's stream to the apiserver.
type usageServer struct{ n *Node }

func (s usageServer) Usage(ctx context.Context, q api.UsageQuery) (api.UsagePage, error) {
	if q.Ack {
		s.n.mu.Lock()
		s.n.usageAcked = max(s.n.usageAcked, min(q.After, uint64(len(s.n.usage))))
		s.n.mu.Unlock()
	}
	return s.n.Usage(ctx, q.After, q.Limit)
}

// Usage serves GET /v1/usage as ctld does (it keeps every record).
func (n *Node) Usage(ctx context.Context, after uint64, limit int) (api.UsagePage, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := api.UsagePage{Records: []api.UsageRecord{}, Next: after, Last: uint64(len(n.usage))}
	if len(n.usage) > 0 {
		p.First = 1
	}
	for s := after + 1; s <= uint64(len(n.usage)) && len(p.Records) < limit; s++ {
		p.Records = append(p.Records, n.usage[s-1])
		p.Next = s
	}
	return p, nil
}

// SetEgress sets the egress counter of sandbox id's network (its nft
// chain's accepted bytes on a real node).
func (n *Node) SetEgress(id string, txBytes uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	sb, ok := n.sandboxes[id]
	if !ok || sb.Network == nil {
		return
	}
	st := *sb.Network
	st.TxBytes = txBytes
	sb.Network = &st
	n.sandboxes[id] = sb
}
