package netpolicy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/logging"
)

// PeerName is the sandbox end of every veth, inside the sandbox's netns:
// runsc's netstack takes over the netns's links, so the guest sees it as
// its eth0.
const PeerName = "eth0"

// Links makes the veth pair that joins a generation's netns to the node's
// (root) netns, where the firewall sees the sandbox's traffic as ingress
// on the host end. Only netlink and /proc/sys are used, never `ip`.
//
// The root netns is the calling process's. Calls for the same owner must
// not run concurrently; the node serializes work per sandbox.
type Links struct {
	Logger *slog.Logger
	// ProcSys is where the sysctls are written; empty means /proc/sys.
	ProcSys string
}

func (l *Links) logger() *slog.Logger { return logging.OrDiscard(l.Logger) }

func (l *Links) procSys() string {
	if l.ProcSys == "" {
		return "/proc/sys"
	}
	return l.ProcSys
}

// checkOwner refuses an owner whose block cannot be plumbed: a Make with
// it would change nothing before failing.
func checkOwner(o Owner) error {
	b := o.Block
	bad := func(format string, args ...any) error {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "links of %s: "+format, append([]any{o.Alias()}, args...)...)
	}
	switch {
	case b.Slot < 1 || b.Slot >= MaxSlots:
		return bad("slot %d outside 1..%d", b.Slot, MaxSlots-1)
	case !b.Net4.IsValid() || !b.Net4.Addr().Is4() || !b.Net4.Contains(b.Gateway4) || !b.Net4.Contains(b.Addr4) || b.Gateway4 == b.Addr4:
		return bad("IPv4 block %v with gateway %v and address %v is not a block", b.Net4, b.Gateway4, b.Addr4)
	case b.Net6.IsValid() && (!b.Net6.Addr().Is6() || !b.Net6.Contains(b.Gateway6) || !b.Net6.Contains(b.Addr6) || b.Gateway6 == b.Addr6):
		return bad("IPv6 block %v with gateway %v and address %v is not a block", b.Net6, b.Gateway6, b.Addr6)
	case !b.Net6.IsValid() && (b.Gateway6.IsValid() || b.Addr6.IsValid()):
		return bad("IPv6 addresses without an IPv6 block")
	}
	return nil
}

// Make creates o's veth pair: the host end o.Link() in the root netns
// (alias o.Alias(), the gateway addresses, rp_filter=1, up) and its peer
// PeerName in the netns at nsPath (the sandbox addresses, up, default
// routes via the gateways). IPv6 addresses skip duplicate address
// detection: the /126 holds only the two ends, and a tentative address
// would keep the guest from its gateway for a second.
//
// Make is safe to repeat and to retry after a crash at any point: a pair
// whose host end exists and whose peer is PeerName in this netns is
// completed; a link of that name that is not such a pair (its peer in
// another netns, or not a veth) is deleted and made again, unless it
// carries another generation's alias (conflict: not ours to delete).
func (l *Links) Make(ctx context.Context, o Owner, nsPath string) error {
	if err := checkOwner(o); err != nil {
		return err
	}
	if !filepath.IsAbs(nsPath) {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "links of %s: netns path %q is not absolute", o.Alias(), nsPath)
	}
	name := o.Link()
	log := l.logger().With("link", name, "owner", o.Alias(), "netns", nsPath)
	nsh, err := netns.GetFromPath(nsPath)
	if err != nil {
		return fmt.Errorf("links of %s: open netns %s: %w", o.Alias(), nsPath, err)
	}
	defer nsh.Close()
	root, err := netlink.NewHandle()
	if err != nil {
		return fmt.Errorf("links of %s: netlink: %w", o.Alias(), err)
	}
	defer root.Close()
	in, err := netlink.NewHandleAt(nsh)
	if err != nil {
		return fmt.Errorf("links of %s: netlink in netns %s: %w", o.Alias(), nsPath, err)
	}
	defer in.Close()

	host, peer, err := l.pair(ctx, root, in, nsh, o, log)
	if err != nil {
		return fmt.Errorf("links of %s: %w", o.Alias(), err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("links of %s: %w", o.Alias(), err)
	}
	if host.Attrs().Alias != o.Alias() {
		// The kernel ignores IFLA_IFALIAS when it creates a link, so the
		// alias is always set afterwards.
		if err := root.LinkSetAlias(host, o.Alias()); err != nil {
			return fmt.Errorf("links of %s: set alias of %s: %w", o.Alias(), name, err)
		}
	}
	b := o.Block
	// The host end first: its addresses and up, so the peer's routes find
	// a live gateway; rp_filter before up, so no packet passes unchecked.
	if err := l.writeSysctl(filepath.Join("net/ipv4/conf", name, "rp_filter"), "1"); err != nil {
		return fmt.Errorf("links of %s: %w", o.Alias(), err)
	}
	if err := addrs(root, host, b.Gateway4, b.Net4, b.Gateway6, b.Net6); err != nil {
		return fmt.Errorf("links of %s: host end %s: %w", o.Alias(), name, err)
	}
	if err := root.LinkSetUp(host); err != nil {
		return fmt.Errorf("links of %s: set %s up: %w", o.Alias(), name, err)
	}
	if err := addrs(in, peer, b.Addr4, b.Net4, b.Addr6, b.Net6); err != nil {
		return fmt.Errorf("links of %s: %s in netns %s: %w", o.Alias(), PeerName, nsPath, err)
	}
	if err := in.LinkSetUp(peer); err != nil {
		return fmt.Errorf("links of %s: set %s up in netns %s: %w", o.Alias(), PeerName, nsPath, err)
	}
	gws := []netip.Addr{b.Gateway4}
	if b.Net6.IsValid() {
		gws = append(gws, b.Gateway6)
	}
	for _, gw := range gws {
		r := &netlink.Route{LinkIndex: peer.Attrs().Index, Gw: net.IP(gw.AsSlice())}
		if err := in.RouteReplace(r); err != nil {
			return fmt.Errorf("links of %s: default route via %v in netns %s: %w", o.Alias(), gw, nsPath, err)
		}
	}
	log.Info("links made", "gateway4", b.Gateway4, "addr4", b.Addr4, "gateway6", b.Gateway6, "addr6", b.Addr6)
	return nil
}

// pair returns o's host end and its peer, making the pair if needed.
func (l *Links) pair(ctx context.Context, root, in *netlink.Handle, nsh netns.NsHandle, o Owner, log *slog.Logger) (host, peer netlink.Link, err error) {
	name := o.Link()
	host, err = linkByName(root, name)
	if err != nil {
		return nil, nil, err
	}
	if host != nil {
		if a := host.Attrs().Alias; a != "" && a != o.Alias() {
			return nil, nil, errdefs.Errorf(errdefs.CodeConflict, "link %s exists with the alias %q of another owner", name, a)
		}
		peer, why, err := peerOf(root, in, nsh, host)
		if err != nil {
			return nil, nil, err
		}
		if peer != nil {
			return host, peer, nil // a pair of an earlier try: complete it
		}
		log.Warn("link of an earlier try is not this netns's pair, making it again", "why", why)
		if err := root.LinkDel(host); err != nil && !errors.Is(err, unix.ENODEV) {
			return nil, nil, fmt.Errorf("delete stale %s: %w", name, err)
		}
	}
	// A PeerName left in the netns is a half of a pair whose host end is
	// gone (deleting either end deletes both, so only a foreign link can
	// be there): the netns is this generation's alone, so it goes.
	if stale, err := linkByName(in, PeerName); err != nil {
		return nil, nil, err
	} else if stale != nil {
		log.Warn("deleting a stale link in the netns", "peer", PeerName, "type", stale.Type())
		if err := in.LinkDel(stale); err != nil && !errors.Is(err, unix.ENODEV) {
			return nil, nil, fmt.Errorf("delete stale %s in netns: %w", PeerName, err)
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: name, Alias: o.Alias()},
		PeerName:      PeerName,
		PeerNamespace: netlink.NsFd(int(nsh)),
	}
	if err := root.LinkAdd(veth); err != nil {
		return nil, nil, fmt.Errorf("add veth %s/%s: %w", name, PeerName, err)
	}
	if host, err = linkByName(root, name); err != nil || host == nil {
		return nil, nil, fmt.Errorf("find new veth %s: %v", name, err)
	}
	peer, why, err := peerOf(root, in, nsh, host)
	if err != nil {
		return nil, nil, err
	}
	if peer == nil {
		return nil, nil, fmt.Errorf("new veth %s: %s", name, why)
	}
	return host, peer, nil
}

// peerOf returns host's peer if host is a veth whose peer is PeerName in
// the netns nsh, else nil and why not.
func peerOf(root, in *netlink.Handle, nsh netns.NsHandle, host netlink.Link) (netlink.Link, string, error) {
	if host.Type() != "veth" {
		return nil, fmt.Sprintf("a %s, not a veth", host.Type()), nil
	}
	nsid, err := root.GetNetNsIdByFd(int(nsh))
	if err != nil {
		return nil, "", fmt.Errorf("netns id: %w", err)
	}
	// A netns with no id in the root netns holds no peer of a root link
	// (the kernel assigns one when a veth's peer is put there); -1 is
	// also what a veth whose peer is in the root netns reports.
	if nsid < 0 || host.Attrs().NetNsID != nsid {
		return nil, fmt.Sprintf("its peer is in netns id %d, not in the sandbox's (id %d)", host.Attrs().NetNsID, nsid), nil
	}
	peer, err := linkByName(in, PeerName)
	if err != nil {
		return nil, "", err
	}
	if peer == nil {
		return nil, "no " + PeerName + " in the netns", nil
	}
	if peer.Attrs().Index != host.Attrs().ParentIndex || peer.Attrs().ParentIndex != host.Attrs().Index {
		return nil, fmt.Sprintf("%s in the netns is not its peer", PeerName), nil
	}
	return peer, "", nil
}

// linkByName returns the link, or nil if there is none of that name.
func linkByName(h *netlink.Handle, name string) (netlink.Link, error) {
	link, err := h.LinkByName(name)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) || errors.Is(err, unix.ENODEV) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("find link %s: %w", name, err)
	}
	return link, nil
}

// addrs puts a4 (in net4) and, if net6 is set, a6 (in net6, no DAD) on
// link; an address already there is replaced, so a retry succeeds.
func addrs(h *netlink.Handle, link netlink.Link, a4 netip.Addr, net4 netip.Prefix, a6 netip.Addr, net6 netip.Prefix) error {
	want := []*netlink.Addr{{IPNet: ipNet(a4, net4.Bits())}}
	if net6.IsValid() {
		want = append(want, &netlink.Addr{IPNet: ipNet(a6, net6.Bits()), Flags: unix.IFA_F_NODAD})
	}
	for _, a := range want {
		if err := h.AddrReplace(link, a); err != nil {
			return fmt.Errorf("address %v: %w", a.IPNet, err)
		}
	}
	return nil
}

func ipNet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(bits, a.BitLen())}
}

// Remove deletes the host end link (its peer goes with it). It is
// idempotent: no such link is success. Only ctld's link names are
// accepted.
func (l *Links) Remove(ctx context.Context, link string) error {
	if _, ok := ParseLinkName(link); !ok {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "remove link %q: not a ctld link name (%s<slot>)", link, LinkPrefix)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("remove link %s: %w", link, err)
	}
	root, err := netlink.NewHandle()
	if err != nil {
		return fmt.Errorf("remove link %s: netlink: %w", link, err)
	}
	defer root.Close()
	host, err := linkByName(root, link)
	if err != nil || host == nil {
		return err
	}
	if err := root.LinkDel(host); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("remove link %s: %w", link, err)
	}
	l.logger().Info("link removed", "link", link, "alias", host.Attrs().Alias)
	return nil
}

// CheckGone is the cleanup proof of o's links: no link o.Link(), no link
// with the alias o.Alias(), and no address of o's block on any link of the
// root netns. detail names everything that is left.
func (l *Links) CheckGone(ctx context.Context, o Owner) (ok bool, detail string) {
	if err := ctx.Err(); err != nil {
		return false, err.Error()
	}
	root, err := netlink.NewHandle()
	if err != nil {
		return false, fmt.Sprintf("netlink: %v", err)
	}
	defer root.Close()
	links, err := retryDump(root.LinkList)
	if err != nil {
		return false, fmt.Sprintf("list links: %v", err)
	}
	var left []string
	names := map[int]string{}
	for _, lk := range links {
		a := lk.Attrs()
		names[a.Index] = a.Name
		switch {
		case a.Name == o.Link():
			left = append(left, fmt.Sprintf("link %s (alias %q) exists", a.Name, a.Alias))
		case a.Alias == o.Alias():
			left = append(left, fmt.Sprintf("link %s has the alias %q", a.Name, a.Alias))
		}
	}
	as, err := retryDump(func() ([]netlink.Addr, error) { return root.AddrList(nil, netlink.FAMILY_ALL) })
	if err != nil {
		return false, fmt.Sprintf("list addresses: %v", err)
	}
	for _, a := range as {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		if o.Block.Net4.Contains(ip) || o.Block.Net6.IsValid() && o.Block.Net6.Contains(ip) {
			left = append(left, fmt.Sprintf("address %v is on link %s", ip, names[a.LinkIndex]))
		}
	}
	if len(left) > 0 {
		return false, strings.Join(left, "; ")
	}
	return true, fmt.Sprintf("no link %s, none with alias %q, no address of %v", o.Link(), o.Alias(), blockNets(o.Block))
}

func blockNets(b Block) string {
	if b.Net6.IsValid() {
		return b.Net4.String() + " or " + b.Net6.String()
	}
	return b.Net4.String()
}

// List names the links of the root netns whose names start with
// LinkPrefix, sorted.
func (l *Links) List(ctx context.Context) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	root, err := netlink.NewHandle()
	if err != nil {
		return nil, fmt.Errorf("list links: netlink: %w", err)
	}
	defer root.Close()
	links, err := retryDump(root.LinkList)
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	var out []string
	for _, lk := range links {
		if n := lk.Attrs().Name; strings.HasPrefix(n, LinkPrefix) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out, nil
}

// EnableForwarding turns on IPv4 forwarding and, when v6, IPv6 forwarding
// on all links (net.ipv4.ip_forward, net.ipv6.conf.all.forwarding). It is
// idempotent and writes only what differs. IPv6 forwarding makes the
// node's uplink ignore router advertisements unless its accept_ra is 2
// (docs/operations.md).
func (l *Links) EnableForwarding(ctx context.Context, v6 bool) error {
	keys := []string{"net/ipv4/ip_forward"}
	if v6 {
		keys = append(keys, "net/ipv6/conf/all/forwarding")
	}
	for _, k := range keys {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("enable forwarding: %w", err)
		}
		if err := l.writeSysctl(k, "1"); err != nil {
			return fmt.Errorf("enable forwarding: %w", err)
		}
	}
	return nil
}

// writeSysctl sets key (a path under ProcSys) to v unless it already is.
func (l *Links) writeSysctl(key, v string) error {
	p := filepath.Join(l.procSys(), key)
	b, err := os.ReadFile(p)
	if err != nil {
		return fmt.Errorf("read %s: %w", p, err)
	}
	if strings.TrimSpace(string(b)) == v {
		return nil
	}
	if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	l.logger().Info("sysctl set", "key", strings.ReplaceAll(key, "/", "."), "value", v, "was", strings.TrimSpace(string(b)))
	return nil
}

// dumpTries bounds retryDump: a dump interrupted this often in a row means
// something churns links without end, and the caller should say so.
const dumpTries = 5

// retryDump runs a netlink dump again while the kernel flags it as
// interrupted (NLM_F_DUMP_INTR: links or addresses changed during it, as
// they do while other sandboxes come and go); such a dump may be
// incomplete, and a proof must not pass on one.
func retryDump[T any](dump func() ([]T, error)) ([]T, error) {
	var err error
	for range dumpTries {
		var out []T
		if out, err = dump(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			return out, err
		}
	}
	return nil, fmt.Errorf("%w (%d times in a row)", err, dumpTries)
}
