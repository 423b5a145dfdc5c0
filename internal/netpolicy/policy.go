package netpolicy

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/ctld/ctld/internal/errdefs"
)

// The policy model: what a claim or a live update asks of a sandbox's
// network, as plain data. Parse checks and normalises the caller's text;
// Effective (effective.go) turns a policy plus the node's address facts
// into the sets the firewall enforces. Nothing here touches the kernel.

// Mode is a sandbox's network mode. The values are the wire names of the
// API's network.mode.
type Mode string

const (
	// ModeDenyAll: loopback only, nothing leaves the sandbox (the default).
	ModeDenyAll Mode = "deny_all"
	// ModeOpen: every address except the ranges that are never reachable
	// and, unless a rule lists them, the private ranges.
	ModeOpen Mode = "open"
	// ModeRestricted: only what a rule allows (CIDRs, and the answers of
	// allowed domain names through the node's DNS proxy).
	ModeRestricted Mode = "restricted"
)

// Modes lists every mode, for messages and tests.
var Modes = []Mode{ModeDenyAll, ModeOpen, ModeRestricted}

// Proto is the transport protocol of a rule. The empty Proto in a Rule
// means both.
type Proto string

const (
	ProtoTCP  Proto = "tcp"
	ProtoUDP  Proto = "udp"
	ProtoBoth Proto = ""
)

// PortRange is an inclusive range of ports; From == To is one port.
type PortRange struct {
	From, To uint16
}

func (r PortRange) String() string {
	if r.From == r.To {
		return strconv.Itoa(int(r.From))
	}
	return fmt.Sprintf("%d-%d", r.From, r.To)
}

// AllPorts is every port a rule without ports allows.
var AllPorts = PortRange{0, 65535}

// Rule allows traffic to one destination: exactly one of CIDR (v4 or v6)
// and Domain (an exact name, or "*.suffix" for every name strictly below
// suffix). Ports empty means every port; Protocol empty means tcp and
// udp.
type Rule struct {
	CIDR     netip.Prefix
	Domain   string
	Protocol Proto
	Ports    []PortRange
}

// IsDomain reports whether the rule names a domain, not a CIDR.
func (r Rule) IsDomain() bool { return r.Domain != "" }

// Target is the rule's destination as the caller wrote it, normalised.
func (r Rule) Target() string {
	if r.IsDomain() {
		return r.Domain
	}
	return r.CIDR.String()
}

func (r Rule) String() string {
	var b strings.Builder
	b.WriteString(r.Target())
	if r.Protocol != ProtoBoth {
		b.WriteString(" " + string(r.Protocol))
	}
	if len(r.Ports) > 0 {
		b.WriteString(" ports ")
		for i, p := range r.Ports {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(p.String())
		}
	}
	return b.String()
}

// Policy is a validated, normalised network policy: two policies that
// allow the same rules compare equal with Equal (rules sorted, duplicates
// merged, CIDRs masked, names lower-case).
type Policy struct {
	Mode  Mode
	Rules []Rule
}

// Equal reports whether p and q are the same normalised policy.
func (p Policy) Equal(q Policy) bool {
	return p.Mode == q.Mode && slices.EqualFunc(p.Rules, q.Rules, func(a, b Rule) bool {
		return a.CIDR == b.CIDR && a.Domain == b.Domain && a.Protocol == b.Protocol && slices.Equal(a.Ports, b.Ports)
	})
}

// Spec is a policy as the caller wrote it (the API's network object):
// strings, not yet checked.
type Spec struct {
	Mode  string
	Rules []RuleSpec
}

// RuleSpec is one rule as the caller wrote it. Ports are "443" or
// "8000-8100".
type RuleSpec struct {
	CIDR     string
	Domain   string
	Protocol string
	Ports    []string
}

// Limits bound a policy, so a policy the API accepts is one the node can
// load (every rule becomes set elements).
type Limits struct {
	// MaxRules is the most rules a policy may have (zero: DefaultMaxRules).
	MaxRules int
	// MaxPorts is the most port entries one rule may have (zero:
	// DefaultMaxPorts).
	MaxPorts int
}

// Defaults of Limits: far above a sane allowlist, far below what makes an
// nft transaction slow.
const (
	DefaultMaxRules = 256
	DefaultMaxPorts = 32
)

func (l Limits) maxRules() int {
	if l.MaxRules <= 0 {
		return DefaultMaxRules
	}
	return l.MaxRules
}

func (l Limits) maxPorts() int {
	if l.MaxPorts <= 0 {
		return DefaultMaxPorts
	}
	return l.MaxPorts
}

// DNS name limits (RFC 1035 2.3.4; 253 is 255 octets on the wire less the
// length octets of the first label and the root).
const (
	MaxNameLen  = 253
	MaxLabelLen = 63
)

// Parse checks a policy and returns its normal form. field names the
// policy in messages ("network"); every error is invalid_argument and
// names the offending rule by its index and text, so a caller can fix the
// one entry. An empty mode is deny_all.
func (l Limits) Parse(field string, s Spec) (Policy, error) {
	mode := Mode(s.Mode)
	switch mode {
	case "":
		mode = ModeDenyAll
	case ModeDenyAll, ModeOpen, ModeRestricted:
	default:
		return Policy{}, invalid("unknown %s.mode %s: must be one of %q, %q, %q", field, errdefs.Quote(s.Mode), ModeDenyAll, ModeOpen, ModeRestricted)
	}
	if n := len(s.Rules); n > l.maxRules() {
		return Policy{}, invalid("%s.rules has %d rules, more than %d", field, n, l.maxRules())
	}
	if mode == ModeDenyAll && len(s.Rules) > 0 {
		return Policy{}, invalid("%s.rules: mode %q takes no rules (use %q to allow destinations)", field, ModeDenyAll, ModeRestricted)
	}
	rules := make([]Rule, 0, len(s.Rules))
	for i, rs := range s.Rules {
		r, err := l.parseRule(rs)
		if err != nil {
			if _, ok := err.(destProblem); ok {
				// The message quotes the destination already.
				return Policy{}, invalid("%s.rules[%d]: %s", field, i, err)
			}
			return Policy{}, invalid("%s.rules[%d] %s: %s", field, i, describe(rs), err)
		}
		if r.IsDomain() && mode != ModeRestricted {
			return Policy{}, invalid("%s.rules[%d] %s: a domain rule needs mode %q (mode %q allows every public address already)", field, i, describe(rs), ModeRestricted, mode)
		}
		rules = append(rules, r)
	}
	return Policy{Mode: mode, Rules: normalize(rules)}, nil
}

// ParseDefault is Parse with the default limits.
func ParseDefault(field string, s Spec) (Policy, error) { return Limits{}.Parse(field, s) }

func invalid(format string, args ...any) error {
	return errdefs.Errorf(errdefs.CodeInvalidArgument, format, args...)
}

// describe renders a rule as the caller wrote it, for a message.
func describe(rs RuleSpec) string {
	var parts []string
	if rs.CIDR != "" {
		parts = append(parts, "cidr "+errdefs.Quote(rs.CIDR))
	}
	if rs.Domain != "" {
		parts = append(parts, "domain "+errdefs.Quote(rs.Domain))
	}
	if len(parts) == 0 {
		return "(no cidr or domain)"
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// problem is a reason without a code; Parse puts the rule and code around
// it.
type problem string

func (p problem) Error() string { return string(p) }

func problemf(format string, args ...any) error { return problem(fmt.Sprintf(format, args...)) }

// destProblem is a bad cidr or domain; its message quotes the value.
type destProblem struct{ error }

func (l Limits) parseRule(rs RuleSpec) (Rule, error) {
	var r Rule
	switch {
	case rs.CIDR != "" && rs.Domain != "":
		return Rule{}, problem("has both cidr and domain: a rule names one destination")
	case rs.CIDR == "" && rs.Domain == "":
		return Rule{}, problem("names no destination: set cidr or domain")
	case rs.CIDR != "":
		p, err := ParseCIDR(rs.CIDR)
		if err != nil {
			return Rule{}, destProblem{err}
		}
		r.CIDR = p
	default:
		d, err := ParseDomain(rs.Domain)
		if err != nil {
			return Rule{}, destProblem{err}
		}
		r.Domain = d
	}
	switch p := Proto(rs.Protocol); p {
	case ProtoTCP, ProtoUDP, ProtoBoth:
		r.Protocol = p
	default:
		return Rule{}, problemf("unknown protocol %s: must be %q, %q or empty for both", errdefs.Quote(rs.Protocol), ProtoTCP, ProtoUDP)
	}
	if n := len(rs.Ports); n > l.maxPorts() {
		return Rule{}, problemf("has %d port entries, more than %d (use ranges)", n, l.maxPorts())
	}
	for _, ps := range rs.Ports {
		pr, err := ParsePortRange(ps)
		if err != nil {
			return Rule{}, err
		}
		r.Ports = append(r.Ports, pr)
	}
	r.Ports = mergePorts(r.Ports)
	return r, nil
}

// ParseCIDR reads a v4 or v6 prefix, or a bare address as a single-address
// prefix, and returns it masked ("10.1.2.3/8" is 10.0.0.0/8). IPv4-mapped
// IPv6 addresses and zones are refused: they would be policed as IPv6 and
// never match the IPv4 packets they look like.
func ParseCIDR(s string) (netip.Prefix, error) {
	var p netip.Prefix
	if strings.Contains(s, "/") {
		var err error
		if p, err = netip.ParsePrefix(s); err != nil {
			return netip.Prefix{}, problemf("invalid cidr %s: want an address/length like 203.0.113.0/24 or 2001:db8::/32", errdefs.Quote(s))
		}
	} else {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return netip.Prefix{}, problemf("invalid cidr %s: want an address/length like 203.0.113.0/24 or 2001:db8::/32", errdefs.Quote(s))
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if p.Addr().Is4In6() {
		return netip.Prefix{}, problemf("invalid cidr %s: an IPv4-mapped IPv6 address; write the IPv4 form", errdefs.Quote(s))
	}
	return p.Masked(), nil
}

// ParseDomain checks a domain name ("example.com", or "*.example.com" for
// every name below example.com) and returns it lower-case without a
// trailing dot. Labels are letters, digits, '-' and '_' (not starting or
// ending with '-'), at most 63 bytes; the name at most 253; a
// non-ASCII name must be given in its xn-- form; a wildcard is only the
// whole first label and needs at least two labels after it, so "*.com"
// cannot open a whole top-level domain.
func ParseDomain(s string) (string, error) {
	bad := func(why string) error {
		return problemf("invalid domain %s: %s", errdefs.Quote(s), why)
	}
	// Before lower-casing: strings.ToLower maps some non-ASCII letters
	// (U+212A KELVIN SIGN) to ASCII ones, which would turn a name into
	// another one.
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return "", bad("not ASCII: give the xn-- (punycode) form of the name")
		}
	}
	name := strings.ToLower(strings.TrimSuffix(s, "."))
	if name == "" {
		return "", bad("empty")
	}
	if len(name) > MaxNameLen {
		return "", bad(fmt.Sprintf("%d bytes, more than %d", len(name), MaxNameLen))
	}
	if _, err := netip.ParseAddr(name); err == nil {
		return "", bad("an address, not a name: use cidr")
	}
	labels := strings.Split(name, ".")
	wild := labels[0] == "*"
	if wild {
		labels = labels[1:]
		if len(labels) < 2 {
			return "", bad("a wildcard needs at least two labels after it (\"*.example.com\")")
		}
	}
	for _, l := range labels {
		if why := labelProblem(l); why != "" {
			return "", bad(why)
		}
	}
	if allDigits(labels[len(labels)-1]) {
		return "", bad("the last label is all digits: not a host name")
	}
	return name, nil
}

func labelProblem(l string) string {
	switch {
	case l == "":
		return "an empty label (two dots, or a leading dot)"
	case len(l) > MaxLabelLen:
		return fmt.Sprintf("label %s is %d bytes, more than %d", errdefs.Quote(l), len(l), MaxLabelLen)
	case strings.Contains(l, "*"):
		return "'*' is allowed only as the whole first label (\"*.example.com\")"
	case l[0] == '-' || l[len(l)-1] == '-':
		return fmt.Sprintf("label %s starts or ends with '-'", errdefs.Quote(l))
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return fmt.Sprintf("label %s has %q: only letters, digits, '-' and '_'", errdefs.Quote(l), c)
		}
	}
	return ""
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// ParsePortRange reads "443" or "8000-8100". Port 0 is refused: no
// connection goes to it.
func ParsePortRange(s string) (PortRange, error) {
	bad := func(why string) (PortRange, error) {
		return PortRange{}, problemf("invalid port %s: %s", errdefs.Quote(s), why)
	}
	a, b, isRange := strings.Cut(s, "-")
	from, err := parsePort(a)
	if err != nil {
		return bad("want a port 1-65535 or a range like 8000-8100")
	}
	to := from
	if isRange {
		if to, err = parsePort(b); err != nil {
			return bad("want a port 1-65535 or a range like 8000-8100")
		}
		if to < from {
			return bad("the range ends before it starts")
		}
	}
	return PortRange{from, to}, nil
}

func parsePort(s string) (uint16, error) {
	// ParseUint alone would take "+1" and "0x1bb"; a port is plain digits.
	if s == "" || len(s) > 5 || !allDigits(s) {
		return 0, problem("not a port")
	}
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 {
		return 0, problem("not a port")
	}
	return uint16(n), nil
}

// mergePorts sorts ranges and merges overlapping and adjacent ones. A
// rule's ports that cover every port (1-65535) stay as written: an
// explicit list is not "all ports", see Effective's DNS rule.
func mergePorts(rs []PortRange) []PortRange {
	if len(rs) == 0 {
		return nil
	}
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b PortRange) int { return cmp.Or(cmp.Compare(a.From, b.From), cmp.Compare(a.To, b.To)) })
	out := rs[:1]
	for _, r := range rs[1:] {
		last := &out[len(out)-1]
		if uint32(r.From) <= uint32(last.To)+1 {
			last.To = max(last.To, r.To)
			continue
		}
		out = append(out, r)
	}
	return out
}

// normalize merges rules with the same destination and protocol (ports
// united; no ports, meaning all, wins), folds a tcp and a udp rule with
// the same ports into one for both, and sorts: CIDR rules first (v4, then
// v6, by address and length), then domains, then protocol.
func normalize(rules []Rule) []Rule {
	type key struct {
		cidr   netip.Prefix
		domain string
		proto  Proto
	}
	type ports struct {
		all  bool
		list []PortRange
	}
	merged := map[key]*ports{}
	var order []key
	add := func(k key, r Rule) {
		p := merged[k]
		if p == nil {
			p = &ports{}
			merged[k] = p
			order = append(order, k)
		}
		if len(r.Ports) == 0 {
			p.all = true
		}
		p.list = append(p.list, r.Ports...)
	}
	for _, r := range rules {
		k := key{r.CIDR, r.Domain, r.Protocol}
		if r.Protocol == ProtoBoth {
			k.proto = ProtoTCP
			add(k, r)
			k.proto = ProtoUDP
		}
		add(k, r)
	}
	portsOf := func(k key) []PortRange {
		p := merged[k]
		if p.all {
			return nil
		}
		return mergePorts(p.list)
	}
	var out []Rule
	for _, k := range order {
		if k.proto != ProtoTCP {
			continue
		}
		tcp := portsOf(k)
		r := Rule{CIDR: k.cidr, Domain: k.domain, Protocol: ProtoTCP, Ports: tcp}
		uk := key{k.cidr, k.domain, ProtoUDP}
		if _, ok := merged[uk]; ok && slices.Equal(tcp, portsOf(uk)) {
			r.Protocol = ProtoBoth
			delete(merged, uk)
		}
		out = append(out, r)
	}
	for _, k := range order {
		if k.proto == ProtoUDP && merged[k] != nil {
			out = append(out, Rule{CIDR: k.cidr, Domain: k.domain, Protocol: ProtoUDP, Ports: portsOf(k)})
		}
	}
	slices.SortFunc(out, compareRules)
	return out
}

func compareRules(a, b Rule) int {
	if c := cmp.Compare(b2i(a.IsDomain()), b2i(b.IsDomain())); c != 0 {
		return c
	}
	if !a.IsDomain() {
		if c := cmp.Or(
			cmp.Compare(b2i(a.CIDR.Addr().Is6()), b2i(b.CIDR.Addr().Is6())),
			a.CIDR.Addr().Compare(b.CIDR.Addr()),
			cmp.Compare(a.CIDR.Bits(), b.CIDR.Bits()),
		); c != 0 {
			return c
		}
	} else if c := strings.Compare(a.Domain, b.Domain); c != 0 {
		return c
	}
	return strings.Compare(string(a.Protocol), string(b.Protocol))
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
