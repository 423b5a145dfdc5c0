package netpolicy

import "github.com/ctld/ctld/internal/names"

// Owner is the generation a set of network objects belongs to: its
// sandbox, its generation and the address block of its slot. Every
// subsystem of the sandbox network (links, firewall, flows, DNS proxy)
// names its objects from an Owner, so the cleanup proof and the
// reconciler can find them from the journal record alone.
type Owner struct {
	ID         string
	Generation uint64
	Block      Block
}

// Chain is the owner's nft chain (and the prefix of its sets and counters).
func (o Owner) Chain() string { return ChainName(o.ID, o.Generation) }

// Link is the host end of the owner's veth.
func (o Owner) Link() string { return LinkName(o.Block.Slot) }

// Alias is the host link's ifalias: the generation name, so `ip link`
// says which sandbox a link serves.
func (o Owner) Alias() string { return names.Generation(o.ID, o.Generation) }

// Counters are a generation's packet counters, kept by its nft chain:
// what it sent (accepted egress) and what the policy dropped.
type Counters struct {
	TxBytes        uint64 `json:"tx_bytes"`
	TxPackets      uint64 `json:"tx_packets"`
	DroppedPackets uint64 `json:"dropped_packets"`
}
