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

// Usage serves GET /v1/usage as ctld does.
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
