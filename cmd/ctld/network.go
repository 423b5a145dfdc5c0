package main

import (
	"bufio"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/ctld/ctld/internal/metrics"
	"github.com/ctld/ctld/internal/netpolicy"
	"github.com/ctld/ctld/internal/netpolicy/dnsproxy"
	"github.com/ctld/ctld/internal/netpolicy/flows"
	"github.com/ctld/ctld/internal/netpolicy/nft"
	"github.com/ctld/ctld/internal/node/network"
	"github.com/spf13/pflag"
)

// netOpts configure the sandbox network (docs/network-design.md).
type netOpts struct {
	nftTable               string
	poolV4, poolV6         string
	poolV4Bits, poolV6Bits int
	dnsPort                int
	upstreams              []string
	resolvConf             string
	maxRules               int
	carriers               int
	elementMinTTL          time.Duration
	elementGrace           time.Duration
}

func (o *netOpts) flags(f *pflag.FlagSet) {
	f.StringVar(&o.nftTable, "nft-table", nft.DefaultTable, "name of ctld's nft table (family inet); ctld never deletes it")
	f.StringVar(&o.poolV4, "net-pool-v4", "10.200.0.0/16", "IPv4 prefix the sandboxes' address blocks come from; it must not overlap any network the node reaches")
	f.IntVar(&o.poolV4Bits, "net-pool-v4-bits", netpolicy.DefaultV4Bits, "IPv4 block per sandbox: 31 (gateway, sandbox) or 30")
	f.StringVar(&o.poolV6, "net-pool-v6", "", "ULA prefix (inside fc00::/7) for the sandboxes' IPv6 blocks; empty: no IPv6, all of a sandbox's IPv6 is dropped")
	f.IntVar(&o.poolV6Bits, "net-pool-v6-bits", 0, "IPv6 block per sandbox: 126 (default when --net-pool-v6 is set) or 127")
	f.IntVar(&o.dnsPort, "dns-proxy-port", 10053, "port of the DNS proxy on the node; each sandbox's DNS to its gateway is redirected there")
	f.StringSliceVar(&o.upstreams, "dns-upstream", nil, "resolver the DNS proxy forwards allowed names to, ADDR or ADDR:PORT (repeatable; default: the nameservers of --resolv-conf)")
	f.StringVar(&o.resolvConf, "resolv-conf", "/etc/resolv.conf", "where the default --dns-upstream resolvers are read from")
	f.DurationVar(&o.elementMinTTL, "dns-element-min-ttl", dnsproxy.DefaultElementMinTTL, fmt.Sprintf("floor of the TTL a resolved address stays allowed for (nft set element timeout: min(max(TTL, this), %v) + --dns-element-grace); raise it above the failover time plus a guest's lookup interval so short TTLs keep a destination open across a failover (1s-%v)", dnsproxy.MaxTTL, dnsproxy.MaxTTL))
	f.DurationVar(&o.elementGrace, "dns-element-grace", dnsproxy.DefaultElementGrace, fmt.Sprintf("added to a resolved address's set element timeout so it outlives the guest's cache of the answer (1s-%v)", dnsproxy.MaxElementGrace))
	f.IntVar(&o.carriers, "warm-carriers", 0, "warm network carriers (netns + veth + address, deny-all) kept ready so a claim only applies its policy; refilled in the background, bounded by the address pool; 0: none")
	f.IntVar(&o.maxRules, "net-max-rules", netpolicy.DefaultMaxRules, fmt.Sprintf("most rules a sandbox's network policy may have (1-%d)", netpolicy.DefaultMaxRules))
}

// pool is the configured address pool, checked.
func (o netOpts) pool() (netpolicy.Pool, error) {
	var p netpolicy.Pool
	var err error
	if p.V4, err = netip.ParsePrefix(o.poolV4); err != nil {
		return p, fmt.Errorf("--net-pool-v4: %w", err)
	}
	p.V4Bits = o.poolV4Bits
	if o.poolV6 != "" {
		if p.V6, err = netip.ParsePrefix(o.poolV6); err != nil {
			return p, fmt.Errorf("--net-pool-v6: %w", err)
		}
		p.V6Bits = o.poolV6Bits
	} else if o.poolV6Bits != 0 {
		return p, fmt.Errorf("--net-pool-v6-bits needs --net-pool-v6")
	}
	if err := p.Check(); err != nil {
		return p, fmt.Errorf("--net-pool-v4/--net-pool-v6: %w", err)
	}
	return p, nil
}

// check validates the options before anything runs.
func (o netOpts) check() error {
	if _, err := o.pool(); err != nil {
		return err
	}
	if o.dnsPort < 1 || o.dnsPort > 65535 || o.dnsPort == 53 {
		return fmt.Errorf("--dns-proxy-port must be between 1 and 65535 and not 53 (the sandboxes' own DNS is redirected to it), got %d", o.dnsPort)
	}
	if _, err := parseUpstreams(o.upstreams); err != nil {
		return err
	}
	pool, _ := o.pool()
	if err := (nft.Config{Table: o.nftTable, DNSPort: uint16(o.dnsPort), Pool: pool}).Check(); err != nil {
		return fmt.Errorf("--nft-table: %w", err)
	}
	if o.elementMinTTL < time.Second || o.elementMinTTL > dnsproxy.MaxTTL {
		return fmt.Errorf("--dns-element-min-ttl must be between 1s and %v, got %v", dnsproxy.MaxTTL, o.elementMinTTL)
	}
	if o.elementGrace < time.Second || o.elementGrace > dnsproxy.MaxElementGrace {
		return fmt.Errorf("--dns-element-grace must be between 1s and %v, got %v", dnsproxy.MaxElementGrace, o.elementGrace)
	}
	if o.carriers < 0 {
		return fmt.Errorf("--warm-carriers must not be negative, got %d", o.carriers)
	}
	if o.maxRules < 1 || o.maxRules > netpolicy.DefaultMaxRules {
		return fmt.Errorf("--net-max-rules must be between 1 and %d, got %d", netpolicy.DefaultMaxRules, o.maxRules)
	}
	return nil
}

// parseUpstreams reads ADDR or ADDR:PORT (port 53 by default).
func parseUpstreams(ss []string) ([]netip.AddrPort, error) {
	var out []netip.AddrPort
	for _, s := range ss {
		if ap, err := netip.ParseAddrPort(s); err == nil {
			out = append(out, ap)
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("--dns-upstream %q: want an address or address:port", s)
		}
		out = append(out, netip.AddrPortFrom(a, 53))
	}
	return out, nil
}

// upstreamResolvers are the DNS proxy's resolvers: the flag's, or the
// nameservers of resolv.conf.
func (o netOpts) upstreamResolvers() ([]netip.AddrPort, error) {
	if len(o.upstreams) > 0 {
		return parseUpstreams(o.upstreams)
	}
	f, err := os.Open(o.resolvConf)
	if err != nil {
		return nil, fmt.Errorf("read default DNS upstreams: %w", err)
	}
	defer f.Close()
	var ss []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) >= 2 && fs[0] == "nameserver" {
			ss = append(ss, fs[1])
		}
	}
	out, err := parseUpstreams(ss)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o.resolvConf, err)
	}
	// A stub resolver on the node's loopback is the node itself, which a
	// sandbox cannot reach; the proxy can.
	return out, sc.Err()
}

// nodeAddrs are the addresses of the node's interfaces (never reachable
// from a sandbox), less the gateways of the sandboxes' own links (inside
// the pool, which is reserved as a whole).
func nodeAddrs(pool netpolicy.Pool) ([]netip.Addr, error) {
	as, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("list the node's addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range as {
		p, err := netip.ParsePrefix(a.String())
		if err != nil {
			continue
		}
		ip := p.Addr().Unmap().WithZone("")
		if pool.V4.Contains(ip) || pool.IPv6() && pool.V6.Contains(ip) {
			continue
		}
		out = append(out, ip)
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return slices.Compact(out), nil
}

// sandboxNet is the sandbox network of one term: the subsystems the node
// drives, and the DNS proxy that serves for the term.
type sandboxNet struct {
	pool     netpolicy.Pool
	addrs    []netip.Addr
	links    *netpolicy.Links
	firewall timedFirewall
	flows    *flows.Conntrack
	proxy    *dnsproxy.Proxy // nil: none (the node refuses what needs it)
}

// buildNet makes the term's network subsystems; nothing touches the
// kernel yet (the node ensures the table and forwarding on reconcile).
// A DNS proxy that cannot be made (no upstream resolver) is left out and
// said so: the node then refuses the policies that resolve names, and
// runs the rest.
func buildNet(o netOpts, m *metrics.Metrics, log *slog.Logger) (sandboxNet, error) {
	var sn sandboxNet
	var err error
	if sn.pool, err = o.pool(); err != nil {
		return sn, err
	}
	if sn.addrs, err = nodeAddrs(sn.pool); err != nil {
		return sn, err
	}
	sn.links = &netpolicy.Links{Logger: log}
	fw, err := nft.New(nft.Config{Table: o.nftTable, DNSPort: uint16(o.dnsPort), Pool: sn.pool}, log)
	if err != nil {
		return sn, fmt.Errorf("firewall: %w", err)
	}
	sn.firewall = timedFirewall{Firewall: fw, m: m}
	// The same (default) mark mask as the firewall's chains set.
	sn.flows = &flows.Conntrack{Logger: log}
	upstreams, err := o.upstreamResolvers()
	if err == nil && len(upstreams) == 0 {
		err = fmt.Errorf("no nameserver in %s and no --dns-upstream", o.resolvConf)
	}
	if err == nil {
		var ss []string
		for _, u := range upstreams {
			ss = append(ss, u.String())
		}
		sn.proxy, err = dnsproxy.New(dnsproxy.Config{
			Listen: fmt.Sprintf(":%d", o.dnsPort), Pool: sn.pool, Upstreams: ss, Allower: sn.firewall, Logger: log,
			ElementMinTTL: o.elementMinTTL, ElementGrace: o.elementGrace, Observe: m.ObserveDNS,
		})
	}
	if err != nil {
		log.Error("DNS proxy unavailable: policies that resolve names are refused", "err", err)
		sn.proxy = nil
	}
	return sn, nil
}

// deps are the node's network subsystems over the netns dir ns.
func (sn sandboxNet) deps(ns *netpolicy.Netns) network.Deps {
	d := network.Deps{Netns: ns, Links: sn.links, Firewall: sn.firewall, Flows: sn.flows, Pool: sn.pool, NodeAddrs: sn.addrs}
	if sn.proxy != nil {
		d.DNSProxy = sn.proxy
	}
	return d
}
