package main

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/ctld/ctld/internal/netpolicy"
	"github.com/spf13/pflag"
)

// netOpts configure the sandbox network (docs/network-design.md).
type netOpts struct {
	poolV4, poolV6         string
	poolV4Bits, poolV6Bits int
	dnsPort                int
	upstreams              []string
	resolvConf             string
	maxRules               int
}

func (o *netOpts) flags(f *pflag.FlagSet) {
	f.StringVar(&o.poolV4, "net-pool-v4", "10.200.0.0/16", "IPv4 prefix the sandboxes' address blocks come from; it must not overlap any network the node reaches")
	f.IntVar(&o.poolV4Bits, "net-pool-v4-bits", netpolicy.DefaultV4Bits, "IPv4 block per sandbox: 31 (gateway, sandbox) or 30")
	f.StringVar(&o.poolV6, "net-pool-v6", "", "ULA prefix (inside fc00::/7) for the sandboxes' IPv6 blocks; empty: no IPv6, all of a sandbox's IPv6 is dropped")
	f.IntVar(&o.poolV6Bits, "net-pool-v6-bits", 0, "IPv6 block per sandbox: 126 (default when --net-pool-v6 is set) or 127")
	f.IntVar(&o.dnsPort, "dns-proxy-port", 10053, "port of the DNS proxy on the node; each sandbox's DNS to its gateway is redirected there")
	f.StringSliceVar(&o.upstreams, "dns-upstream", nil, "resolver the DNS proxy forwards allowed names to, ADDR or ADDR:PORT (repeatable; default: the nameservers of --resolv-conf)")
	f.StringVar(&o.resolvConf, "resolv-conf", "/etc/resolv.conf", "where the default --dns-upstream resolvers are read from")
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
