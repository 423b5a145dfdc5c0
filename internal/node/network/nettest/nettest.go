// Package nettest is the contract of the sandbox network's kernel-facing
// interfaces (network.Netns, network.Links, network.Firewall,
// network.Flows): one suite run against the fake kernel's on the host
// (internal/node/fakekernel) and against netpolicy.Netns, netpolicy.Links,
// nft.Firewall and flows.Conntrack on the test VM's kernel
// (internal/netpolicy), the way containerd's snapshots testsuite runs
// every snapshotter. A case that passes on one and fails on the other is
// a fake that lies.
package nettest

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/netpolicy"
	"github.com/ctld/ctld/internal/node/network"
	"github.com/ctld/ctld/internal/testutil"
)

// Subject is one implementation under test, fresh for each case: its
// firewall's table is not made yet, and it holds no generation's object.
type Subject struct {
	Netns    network.Netns
	Links    network.Links
	Firewall network.Firewall
	Flows    network.Flows
	// Pool is the address pool of the firewall; the cases take the
	// blocks of slots 41 to 49 from it.
	Pool netpolicy.Pool
	// AddFlow makes a conntrack flow from slot's sandbox address to dst,
	// marked as slot's chain marks it (a guest's open connection).
	AddFlow func(t *testing.T, slot netpolicy.Slot, proto netpolicy.Proto, dst netip.AddrPort)
}

// New makes a fresh subject for one case; it cleans up after itself.
type New func(t *testing.T) Subject

// Run runs every case against the subjects newSubject makes.
func Run(t *testing.T, newSubject New) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(t, t.Context(), newSubject(t)) })
	}
}

// owner is the generation id/1 on slot's block of s's pool.
func owner(t *testing.T, s Subject, id string, slot netpolicy.Slot) netpolicy.Owner {
	t.Helper()
	b, err := s.Pool.Block(slot)
	if err != nil {
		t.Fatal(err)
	}
	return netpolicy.Owner{ID: id, Generation: 1, Block: b}
}

// restricted is o's policy allowing tcp 443 to 192.0.2.0/24 and the
// answers for example.com (domain set 0, tcp 443).
func restricted(t *testing.T, s Subject, o netpolicy.Owner) netpolicy.Effective {
	t.Helper()
	return effective(t, s, o, netpolicy.Spec{Mode: string(netpolicy.ModeRestricted), Rules: []netpolicy.RuleSpec{
		{CIDR: "192.0.2.0/24", Protocol: "tcp", Ports: []string{"443"}},
		{Domain: "example.com", Protocol: "tcp", Ports: []string{"443"}},
	}})
}

func effective(t *testing.T, s Subject, o netpolicy.Owner, spec netpolicy.Spec) netpolicy.Effective {
	t.Helper()
	p, err := netpolicy.ParseDefault("network", spec)
	if err != nil {
		t.Fatal(err)
	}
	return netpolicy.Resolve(p, netpolicy.Facts{Pool: s.Pool, Block: o.Block})
}

// netns makes the namespace name and deletes it when the case ends.
func netns(t *testing.T, ctx context.Context, s Subject, name string) string {
	t.Helper()
	t.Cleanup(func() {
		if err := s.Netns.Delete(context.Background(), name); err != nil {
			t.Errorf("cleanup: delete netns %s: %v", name, err)
		}
	})
	p, err := s.Netns.Create(ctx, name)
	if err != nil {
		t.Fatalf("create netns %s: %v", name, err)
	}
	return p
}

// links makes o's pair into the netns at nsPath and removes it when the
// case ends.
func links(t *testing.T, ctx context.Context, s Subject, o netpolicy.Owner, nsPath string) {
	t.Helper()
	t.Cleanup(func() {
		if err := s.Links.Remove(context.Background(), o.Link()); err != nil {
			t.Errorf("cleanup: remove link %s: %v", o.Link(), err)
		}
	})
	if err := s.Links.Make(ctx, o, nsPath); err != nil {
		t.Fatalf("make links of %s: %v", o.Alias(), err)
	}
}

// ensured makes the firewall's table.
func ensured(t *testing.T, ctx context.Context, s Subject) {
	t.Helper()
	if err := s.Firewall.Ensure(ctx); err != nil {
		t.Fatalf("ensure: %v", err)
	}
}

// applied applies eff for o and removes o's objects when the case ends.
func applied(t *testing.T, ctx context.Context, s Subject, o netpolicy.Owner, eff netpolicy.Effective) {
	t.Helper()
	t.Cleanup(func() {
		if err := s.Firewall.Remove(context.Background(), o); err != nil {
			t.Errorf("cleanup: remove nft objects of %s: %v", o.Alias(), err)
		}
	})
	if err := s.Firewall.Apply(ctx, o, eff); err != nil {
		t.Fatalf("apply %s: %v", o.Alias(), err)
	}
}

// eventually polls check for up to 5 s: the kernel ends a namespace (and
// the links in it) after its last reference goes, asynchronously.
func eventually(check func() (bool, string)) (bool, string) {
	return testutil.Eventually(5*time.Second, check)
}

func list(t *testing.T, what string, l func(context.Context) ([]string, error)) []string {
	t.Helper()
	names, err := l(t.Context())
	if err != nil {
		t.Fatalf("list %s: %v", what, err)
	}
	return names
}

var cases = []struct {
	name string
	run  func(t *testing.T, ctx context.Context, s Subject)
}{
	{"a namespace is made once, listed, mounted and identified", func(t *testing.T, ctx context.Context, s Subject) {
		p := netns(t, ctx, s, "nt-new")
		if p != s.Netns.Path("nt-new") {
			t.Errorf("create returned %q, Path says %q", p, s.Netns.Path("nt-new"))
		}
		if p2, err := s.Netns.Create(ctx, "nt-new"); err != nil || p2 != p {
			t.Errorf("second create = %q, %v; want %q", p2, err, p)
		}
		if !slices.Contains(list(t, "netns", s.Netns.List), "nt-new") || !slices.Contains(list(t, "mounted netns", s.Netns.Mounted), "nt-new") {
			t.Error("a new namespace is not listed and mounted")
		}
		id, err := s.Netns.Identify(ctx, "nt-new")
		if err != nil || !id.Known() {
			t.Fatalf("identify = %v, %v; want a known identity", id, err)
		}
		if id2, err := s.Netns.Identify(ctx, "nt-new"); err != nil || id2 != id {
			t.Errorf("identify again = %v, %v; want %v", id2, err, id)
		}
		if ok, detail := s.Netns.CheckGone(ctx, "nt-new", id); ok {
			t.Errorf("check gone of a live namespace: ok (%s)", detail)
		}
	}},
	{"a deleted namespace is gone, and deleting it again is success", func(t *testing.T, ctx context.Context, s Subject) {
		netns(t, ctx, s, "nt-del")
		id, err := s.Netns.Identify(ctx, "nt-del")
		if err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			if err := s.Netns.Delete(ctx, "nt-del"); err != nil {
				t.Fatalf("delete %d: %v", i+1, err)
			}
		}
		if slices.Contains(list(t, "netns", s.Netns.List), "nt-del") || slices.Contains(list(t, "mounted netns", s.Netns.Mounted), "nt-del") {
			t.Error("a deleted namespace is listed")
		}
		if _, err := s.Netns.Identify(ctx, "nt-del"); err == nil {
			t.Error("identify of a deleted namespace: nil, want an error")
		}
		if ok, detail := eventually(func() (bool, string) { return s.Netns.CheckGone(ctx, "nt-del", id) }); !ok {
			t.Errorf("check gone after delete: %s", detail)
		}
		if ok, detail := s.Netns.CheckGone(ctx, "nt-del", netpolicy.NSID{}); !ok {
			t.Errorf("check gone without the identity: %s", detail)
		}
	}},
	{"a bad namespace name is refused", func(t *testing.T, ctx context.Context, s Subject) {
		for _, name := range []string{"", "../x", "a/b"} {
			if _, err := s.Netns.Create(ctx, name); err == nil {
				t.Errorf("create %q: nil, want an error", name)
			}
			if err := s.Netns.Delete(ctx, name); err == nil {
				t.Errorf("delete %q: nil, want an error", name)
			}
			if _, err := s.Netns.Identify(ctx, name); err == nil {
				t.Errorf("identify %q: nil, want an error", name)
			}
			if ok, _ := s.Netns.CheckGone(ctx, name, netpolicy.NSID{}); ok {
				t.Errorf("check gone %q: ok, want not proven", name)
			}
		}
	}},
	{"a pair is made once, listed, not gone, and not another generation's", func(t *testing.T, ctx context.Context, s Subject) {
		o := owner(t, s, "nt-pair", 41)
		ns := netns(t, ctx, s, "nt-pair-g1")
		links(t, ctx, s, o, ns)
		if err := s.Links.Make(ctx, o, ns); err != nil {
			t.Errorf("make the same pair again: %v", err)
		}
		if !slices.Contains(list(t, "links", s.Links.List), o.Link()) {
			t.Errorf("link %s is not listed", o.Link())
		}
		if ok, detail := s.Links.CheckGone(ctx, o); ok || !strings.Contains(detail, o.Link()) {
			t.Errorf("check gone = %v %q; want not gone, naming %s", ok, detail, o.Link())
		}
		other := owner(t, s, "nt-other", 41)
		ns2 := netns(t, ctx, s, "nt-other-g1")
		if err := s.Links.Make(ctx, other, ns2); !errdefs.Is(err, errdefs.CodeConflict) {
			t.Errorf("make another generation's pair on the same slot: %v, want a conflict", err)
		}
		if ok, _ := s.Links.CheckGone(ctx, o); ok {
			t.Error("the refused make took the first pair")
		}
	}},
	{"making a pair again into a new namespace moves it there", func(t *testing.T, ctx context.Context, s Subject) {
		o := owner(t, s, "nt-move", 42)
		links(t, ctx, s, o, netns(t, ctx, s, "nt-move-a"))
		nsB := netns(t, ctx, s, "nt-move-b")
		if err := s.Links.Make(ctx, o, nsB); err != nil {
			t.Fatalf("make into the new namespace: %v", err)
		}
		// The pair lives in b now: deleting a leaves it.
		if err := s.Netns.Delete(ctx, "nt-move-a"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		if ok, _ := s.Links.CheckGone(ctx, o); ok || !slices.Contains(list(t, "links", s.Links.List), o.Link()) {
			t.Error("the pair went with the namespace it left")
		}
	}},
	{"a pair goes with its namespace", func(t *testing.T, ctx context.Context, s Subject) {
		o := owner(t, s, "nt-nsgone", 43)
		links(t, ctx, s, o, netns(t, ctx, s, "nt-nsgone-g1"))
		if err := s.Netns.Delete(ctx, "nt-nsgone-g1"); err != nil {
			t.Fatal(err)
		}
		if ok, detail := eventually(func() (bool, string) { return s.Links.CheckGone(ctx, o) }); !ok {
			t.Errorf("links of a deleted namespace: %s", detail)
		}
	}},
	{"links removed twice are gone; a foreign name or a missing namespace is refused", func(t *testing.T, ctx context.Context, s Subject) {
		o := owner(t, s, "nt-rm", 44)
		links(t, ctx, s, o, netns(t, ctx, s, "nt-rm-g1"))
		for i := range 2 {
			if err := s.Links.Remove(ctx, o.Link()); err != nil {
				t.Fatalf("remove %d: %v", i+1, err)
			}
		}
		if ok, detail := s.Links.CheckGone(ctx, o); !ok {
			t.Errorf("check gone after remove: %s", detail)
		}
		if slices.Contains(list(t, "links", s.Links.List), o.Link()) {
			t.Error("a removed link is listed")
		}
		if err := s.Links.Remove(ctx, "eth0"); !errdefs.Is(err, errdefs.CodeInvalidArgument) {
			t.Errorf("remove eth0: %v, want invalid argument", err)
		}
		if err := s.Links.Make(ctx, o, s.Netns.Path("nt-rm-none")); err == nil {
			t.Error("make into a missing namespace: nil, want an error")
		}
		if err := s.Links.Make(ctx, o, "ctld-nt-rm-g1"); !errdefs.Is(err, errdefs.CodeInvalidArgument) {
			t.Errorf("make into a relative namespace path: %v, want invalid argument", err)
		}
		if ok, detail := s.Links.CheckGone(ctx, o); !ok {
			t.Errorf("a refused make left something: %s", detail)
		}
	}},
	{"apply needs the table, which ensure makes once", func(t *testing.T, ctx context.Context, s Subject) {
		o := owner(t, s, "nt-table", 45)
		if err := s.Firewall.Apply(ctx, o, restricted(t, s, o)); err == nil {
			t.Error("apply before ensure: nil, want an error")
		}
		ensured(t, ctx, s)
		ensured(t, ctx, s)
		if got := list(t, "nft", s.Firewall.List); len(got) != 0 {
			t.Errorf("list of a new table = %q, want none", got)
		}
		applied(t, ctx, s, o, restricted(t, s, o))
		ensured(t, ctx, s) // leaves the generation's objects
		if got := list(t, "nft", s.Firewall.List); !slices.Equal(got, []string{o.Chain()}) {
			t.Errorf("list = %q, want [%s]", got, o.Chain())
		}
	}},
	{"apply makes and replaces a generation's objects, not over another's", func(t *testing.T, ctx context.Context, s Subject) {
		ensured(t, ctx, s)
		o := owner(t, s, "nt-apply", 46)
		applied(t, ctx, s, o, restricted(t, s, o))
		if c, err := s.Firewall.Counters(ctx, o); err != nil || c != (netpolicy.Counters{}) {
			t.Errorf("counters of a new chain = %+v, %v; want zero", c, err)
		}
		if ok, detail := s.Firewall.CheckGone(ctx, o); ok {
			t.Errorf("check gone of an applied generation: ok (%s)", detail)
		}
		if err := s.Firewall.Apply(ctx, o, effective(t, s, o, netpolicy.Spec{Mode: string(netpolicy.ModeOpen)})); err != nil {
			t.Errorf("replace with open: %v", err)
		}
		other := owner(t, s, "nt-apply2", 46)
		if err := s.Firewall.Apply(ctx, other, restricted(t, s, other)); !errdefs.Is(err, errdefs.CodeConflict) {
			t.Errorf("apply another generation on the same link: %v, want a conflict", err)
		}
		if got := list(t, "nft", s.Firewall.List); !slices.Equal(got, []string{o.Chain()}) {
			t.Errorf("list = %q, want only [%s]", got, o.Chain())
		}
		if ok, detail := s.Firewall.CheckGone(ctx, other); ok {
			// The link still dispatches to o: other's proof must not pass
			// over it (the slot's new owner case, seen from the old one).
			t.Errorf("check gone of a generation whose link dispatches elsewhere: ok (%s)", detail)
		}
	}},
	{"removed twice, a generation's objects are gone", func(t *testing.T, ctx context.Context, s Subject) {
		ensured(t, ctx, s)
		o := owner(t, s, "nt-remove", 47)
		applied(t, ctx, s, o, restricted(t, s, o))
		for i := range 2 {
			if err := s.Firewall.Remove(ctx, o); err != nil {
				t.Fatalf("remove %d: %v", i+1, err)
			}
		}
		if ok, detail := s.Firewall.CheckGone(ctx, o); !ok {
			t.Errorf("check gone after remove: %s", detail)
		}
		if got := list(t, "nft", s.Firewall.List); len(got) != 0 {
			t.Errorf("list after remove = %q", got)
		}
		if _, err := s.Firewall.Counters(ctx, o); !errdefs.Is(err, errdefs.CodeNotFound) {
			t.Errorf("counters of a removed generation: %v, want not found", err)
		}
	}},
	{"an orphan is removed by its chain's name only", func(t *testing.T, ctx context.Context, s Subject) {
		ensured(t, ctx, s)
		o := owner(t, s, "nt-orphan", 48)
		applied(t, ctx, s, o, restricted(t, s, o))
		for _, bad := range []string{o.Chain() + ".tx", "input", ""} {
			if err := s.Firewall.RemoveOrphan(ctx, bad); !errdefs.Is(err, errdefs.CodeInvalidArgument) {
				t.Errorf("remove orphan %q: %v, want invalid argument", bad, err)
			}
		}
		for i := range 2 {
			if err := s.Firewall.RemoveOrphan(ctx, o.Chain()); err != nil {
				t.Fatalf("remove orphan %d: %v", i+1, err)
			}
		}
		if ok, detail := s.Firewall.CheckGone(ctx, o); !ok {
			t.Errorf("check gone after remove orphan: %s", detail)
		}
	}},
	{"resolved addresses go into a domain set of the policy only", func(t *testing.T, ctx context.Context, s Subject) {
		ensured(t, ctx, s)
		o := owner(t, s, "nt-dns", 49)
		applied(t, ctx, s, o, restricted(t, s, o))
		addrs := []netip.Addr{netip.MustParseAddr("203.0.113.7")}
		if err := s.Firewall.AllowResolved(ctx, o, 0, addrs, time.Minute); err != nil {
			t.Errorf("allow resolved in set 0: %v", err)
		}
		if err := s.Firewall.AllowResolved(ctx, o, 0, addrs, 2*time.Minute); err != nil {
			t.Errorf("allow the same address again: %v", err)
		}
		if err := s.Firewall.AllowResolved(ctx, o, 3, addrs, time.Minute); err == nil {
			t.Error("allow resolved in a set the policy lacks: nil, want an error")
		}
		for _, bad := range []struct {
			set int
			ttl time.Duration
		}{{-1, time.Minute}, {0, 0}, {0, time.Microsecond}} {
			if err := s.Firewall.AllowResolved(ctx, o, bad.set, addrs, bad.ttl); !errdefs.Is(err, errdefs.CodeInvalidArgument) {
				t.Errorf("allow resolved in set %d for %v: %v, want invalid argument", bad.set, bad.ttl, err)
			}
		}
		if err := s.Firewall.AllowResolved(ctx, o, 3, nil, time.Minute); err != nil {
			t.Errorf("allow no address: %v, want nil", err)
		}
	}},
	{"flush deletes a slot's flows only, and proves them gone", func(t *testing.T, ctx context.Context, s Subject) {
		dst := netip.MustParseAddrPort("192.0.2.9:443")
		s.AddFlow(t, 41, netpolicy.ProtoTCP, dst)
		s.AddFlow(t, 42, netpolicy.ProtoTCP, dst)
		if ok, _ := s.Flows.CheckGone(ctx, 41); ok {
			t.Error("check gone of a slot with a flow: ok")
		}
		for i := range 2 {
			if err := s.Flows.Flush(ctx, 41); err != nil {
				t.Fatalf("flush %d: %v", i+1, err)
			}
		}
		if ok, detail := s.Flows.CheckGone(ctx, 41); !ok {
			t.Errorf("check gone after flush: %s", detail)
		}
		if ok, _ := s.Flows.CheckGone(ctx, 42); ok {
			t.Error("flush of slot 41 took slot 42's flow")
		}
		if err := s.Flows.Flush(ctx, 42); err != nil {
			t.Fatal(err)
		}
	}},
	{"cut deletes the flows a policy does not allow", func(t *testing.T, ctx context.Context, s Subject) {
		o := owner(t, s, "nt-cut", 43)
		eff := restricted(t, s, o)
		keep := []netip.AddrPort{
			netip.MustParseAddrPort("192.0.2.9:443"), // the CIDR rule
			netip.AddrPortFrom(eff.DNS4, 53),         // the DNS proxy
		}
		cut := []netip.AddrPort{
			netip.MustParseAddrPort("192.0.2.9:80"),     // another port
			netip.MustParseAddrPort("198.51.100.1:443"), // another address
			// An answer for example.com may be anywhere: conntrack cannot
			// tell which name a flow's address was answered for, so a flow
			// only a domain set allows is cut (the guest resolves again).
			netip.MustParseAddrPort("203.0.113.7:443"),
		}
		for _, d := range slices.Concat(keep, cut) {
			proto := netpolicy.ProtoTCP
			if d.Port() == 53 {
				proto = netpolicy.ProtoUDP
			}
			s.AddFlow(t, 43, proto, d)
		}
		t.Cleanup(func() { s.Flows.Flush(context.Background(), 43) })
		if n, err := s.Flows.Cut(ctx, 43, eff); err != nil || n != len(cut) {
			t.Errorf("cut = %d, %v; want %d", n, err, len(cut))
		}
		if n, err := s.Flows.Cut(ctx, 43, eff); err != nil || n != 0 {
			t.Errorf("cut again = %d, %v; want 0", n, err)
		}
		if ok, _ := s.Flows.CheckGone(ctx, 43); ok {
			t.Error("cut took the flows the policy allows")
		}
		deny := effective(t, s, o, netpolicy.Spec{Mode: string(netpolicy.ModeDenyAll)})
		if n, err := s.Flows.Cut(ctx, 43, deny); err != nil || n != len(keep) {
			t.Errorf("cut to deny_all = %d, %v; want %d", n, err, len(keep))
		}
		if ok, detail := s.Flows.CheckGone(ctx, 43); !ok {
			t.Errorf("check gone after cutting every flow: %s", detail)
		}
	}},
}
