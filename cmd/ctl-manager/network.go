package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ctld/ctld/internal/api"
)

// networkFlags are the flags that write a network policy, shared by
// `sandbox create` (its --mode is the RootFS's, so the mode flag is named
// there) and `sandbox network`.
type networkFlags struct {
	mode    string
	allow   []string
	domains []string
}

func (n *networkFlags) register(f *pflag.FlagSet, modeFlag, defaultMode string) {
	f.StringVar(&n.mode, modeFlag, defaultMode, "network mode: deny_all, open or restricted")
	f.StringArrayVar(&n.allow, "allow", nil, "allow a destination: CIDR[:PORTS][/PROTO], PORTS like 443,8000-8100, PROTO tcp or udp (default both); IPv6 with ports in brackets: [2001:db8::/32]:443 (repeatable)")
	f.StringArrayVar(&n.domains, "allow-domain", nil, "allow a domain (restricted mode): NAME[:PORTS][/PROTO], NAME exact or *.suffix (repeatable)")
}

// policy builds the policy the flags write. Only the flags' syntax is
// checked here; the node's rules (api.NetworkPolicy.Validate) answer for
// the values, with the same messages a claim gets.
func (n *networkFlags) policy() (api.NetworkPolicy, error) {
	p := api.NetworkPolicy{Mode: api.NetworkMode(n.mode)}
	for _, s := range n.allow {
		r, err := parseAllow(s)
		if err != nil {
			return p, usageError{fmt.Errorf("--allow %q: %w", s, err)}
		}
		p.Rules = append(p.Rules, r)
	}
	for _, s := range n.domains {
		r, err := parseAllowDomain(s)
		if err != nil {
			return p, usageError{fmt.Errorf("--allow-domain %q: %w", s, err)}
		}
		p.Rules = append(p.Rules, r)
	}
	return p, nil
}

// cutProto takes a trailing "/tcp" or "/udp" off s. A prefix length is
// digits, so it is never mistaken for one.
func cutProto(s string) (rest, proto string) {
	for _, p := range []string{"tcp", "udp"} {
		if r, ok := strings.CutSuffix(s, "/"+p); ok {
			return r, p
		}
	}
	return s, ""
}

func splitPorts(s string) ([]string, error) {
	if s == "" {
		return nil, fmt.Errorf("empty port list after ':'")
	}
	return strings.Split(s, ","), nil
}

// parseAllow reads CIDR[:PORTS][/PROTO]; an IPv6 CIDR with ports is
// bracketed ("[2001:db8::/32]:443"), one without may be bare.
func parseAllow(s string) (api.NetworkRule, error) {
	rest, proto := cutProto(s)
	r := api.NetworkRule{Protocol: proto}
	var ports string
	hasPorts := false
	switch {
	case strings.HasPrefix(rest, "["):
		end := strings.IndexByte(rest, ']')
		if end < 0 {
			return r, fmt.Errorf("missing ']' after the bracketed CIDR")
		}
		r.CIDR = rest[1:end]
		after := rest[end+1:]
		if after != "" {
			p, ok := strings.CutPrefix(after, ":")
			if !ok {
				return r, fmt.Errorf("want ':PORTS' after ']', got %q", after)
			}
			ports, hasPorts = p, true
		}
	case strings.Count(rest, ":") == 1: // IPv4 with ports
		r.CIDR, ports, _ = strings.Cut(rest, ":")
		hasPorts = true
	default: // IPv4 or bare IPv6, every port
		r.CIDR = rest
	}
	if r.CIDR == "" {
		return r, fmt.Errorf("empty CIDR")
	}
	if hasPorts {
		ps, err := splitPorts(ports)
		if err != nil {
			return r, err
		}
		r.Ports = ps
	}
	return r, nil
}

// parseAllowDomain reads NAME[:PORTS][/PROTO].
func parseAllowDomain(s string) (api.NetworkRule, error) {
	rest, proto := cutProto(s)
	r := api.NetworkRule{Protocol: proto}
	name, ports, hasPorts := strings.Cut(rest, ":")
	if name == "" {
		return r, fmt.Errorf("empty name")
	}
	r.Domain = name
	if hasPorts {
		ps, err := splitPorts(ports)
		if err != nil {
			return r, err
		}
		r.Ports = ps
	}
	return r, nil
}

func (c *cli) networkCommand() *cobra.Command {
	var nf networkFlags
	cmd := &cobra.Command{
		Use:   "network ID --mode MODE [--allow CIDR[:PORTS][/PROTO]]... [--allow-domain NAME[:PORTS][/PROTO]]...",
		Short: "Replace a running sandbox's network policy (live, without restarting it)",
		Args:  exactArgs(1, "ID"),
	}
	nf.register(cmd.Flags(), "mode", "")
	cmd.PreRunE = func(*cobra.Command, []string) error {
		if nf.mode == "" {
			return usageError{fmt.Errorf("sandbox network needs --mode (deny_all, open or restricted)")}
		}
		_, err := nf.policy()
		return err
	}
	cmd.RunE = c.action(named("update network of sandbox"), func(ctx context.Context, args []string) error {
		p, _ := nf.policy() // checked by PreRunE
		m, done, err := c.manager(ctx, true)
		if err != nil {
			return err
		}
		defer done()
		sb, err := m.UpdateNetwork(ctx, args[0], p)
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(sb)
		}
		fmt.Fprintf(c.stdout, "sandbox %s generation %d: network %s\n", sb.ID, sb.Generation, networkLine(sb.Network, p.EffectiveMode()))
		return nil
	})
	return cmd
}

// networkLine renders a generation's network status; a node that reports
// none shows the mode asked for.
func networkLine(n *api.NetworkStatus, asked api.NetworkMode) string {
	if n == nil {
		return string(asked)
	}
	return fmt.Sprintf("%s, sent %d bytes in %d packets, dropped %d packets", n.Mode, n.TxBytes, n.TxPackets, n.DroppedPackets)
}
