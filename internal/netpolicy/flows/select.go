// Package flows is the conntrack state of the sandboxes' generations: it
// finds a generation's flows by the ct mark its nft chain sets (the slot),
// deletes them on release (Flush), proves them gone (CheckGone) and, on a
// live policy update, deletes the flows the new policy no longer allows
// (Cut). Which flows Cut deletes is a pure function of a flow's original
// tuple and the new netpolicy.Effective (Keep), tested on the host; the
// Conntrack type is the thin netlink part, tested in the VM.
package flows

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/ctld/ctld/internal/netpolicy"
)

// IP protocol numbers of the transports a policy can allow.
const (
	protoTCP = 6
	protoUDP = 17
)

// Tuple is a flow's original direction, as the sandbox opened it: the
// only part of a flow the policy decides on.
type Tuple struct {
	Proto            uint8 // IP protocol number
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
}

func (t Tuple) String() string {
	return fmt.Sprintf("%s %s -> %s", protoName(t.Proto),
		netip.AddrPortFrom(t.Src, t.SrcPort), netip.AddrPortFrom(t.Dst, t.DstPort))
}

func protoName(p uint8) string {
	switch p {
	case protoTCP:
		return "tcp"
	case protoUDP:
		return "udp"
	}
	return fmt.Sprintf("proto %d", p)
}

// Keep reports whether eff still allows the flow t, that is whether the
// generation's new chain would accept t's first packet. It mirrors the
// chain's order (docs/network-design.md §4): anti-spoofing, the reserved
// ranges that stay closed, the allow elements, the domain sets; the DNS
// proxy on the gateway is allowed whenever eff names it.
//
// resolved[i] are the addresses live in domain set i (eff.Domains[i]) after
// the update. A flow to an address not in any allow element is kept only if
// it is in resolved for a set whose protocol and ports match: conntrack
// cannot tell which name an address was answered for, so without resolved
// (nil) a flow that only a domain set could allow is cut. That fails
// closed: the guest re-resolves (the proxy adds the address again) and
// reconnects.
func Keep(t Tuple, eff netpolicy.Effective, resolved [][]netip.Addr) bool {
	var proto netpolicy.Proto
	switch t.Proto {
	case protoTCP:
		proto = netpolicy.ProtoTCP
	case protoUDP:
		proto = netpolicy.ProtoUDP
	default:
		return false // the chain allows tcp and udp only
	}
	src, dst := t.Src.Unmap(), t.Dst.Unmap()
	source, dns, allow, deny := eff.Source4, eff.DNS4, eff.Allow4, eff.Deny4
	if dst.Is6() {
		source, dns, allow, deny = eff.Source6, eff.DNS6, eff.Allow6, eff.Deny6
	}
	if !source.IsValid() || src != source {
		return false // no address of this family, or spoofed: dropped
	}
	if dns.IsValid() && dst == dns && t.DstPort == 53 {
		return true // the DNS proxy
	}
	for _, r := range deny {
		if r.Contains(dst) {
			return false
		}
	}
	for _, el := range allow {
		if el.Proto == proto && el.Dst.Contains(dst) && portIn(t.DstPort, el.Ports) {
			return true
		}
	}
	for i, ds := range eff.Domains {
		if i >= len(resolved) || ds.Proto != proto || !slices.ContainsFunc(ds.Ports, func(r netpolicy.PortRange) bool { return portIn(t.DstPort, r) }) {
			continue
		}
		if slices.ContainsFunc(resolved[i], func(a netip.Addr) bool { return a.Unmap() == dst }) {
			return true
		}
	}
	return false
}

func portIn(p uint16, r netpolicy.PortRange) bool { return r.From <= p && p <= r.To }
