package netpolicy

import (
	"bufio"
	"bytes"
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
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/runsc"
	"github.com/ctld/ctld/internal/template"
)

// testPool is the sandbox pool of the links kernel tests: /31 and /126
// blocks, as shipped by default.
var testPool = Pool{V4: netip.MustParsePrefix("10.231.0.0/20"), V6: netip.MustParsePrefix("fd00:c71d:7e57::/64")}

func testOwner(t *testing.T, id string, slot Slot) Owner {
	t.Helper()
	b, err := testPool.Block(slot)
	if err != nil {
		t.Fatal(err)
	}
	return Owner{ID: id, Generation: 1, Block: b}
}

func testLinks(t *testing.T) *Links {
	return &Links{Logger: slog.New(slog.NewTextHandler(t.Output(), nil))}
}

// staleEth0 adds a dummy named like the sandbox end (eth0) to ns: a link
// there that is not the generation's peer.
func staleEth0(t *testing.T, ns ktest.Netns) {
	t.Helper()
	in, err := netlink.NewHandleAt(ns.Handle)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if err := in.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: PeerName}}); err != nil {
		t.Fatal(err)
	}
}

// kernelLinks starts a kernel test of Links: asked for (fails in the VM
// when it cannot run), leaks checked when it ends.
func kernelLinks(t *testing.T) (context.Context, *Links) {
	ktest.Require(t)
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	return context.Background(), testLinks(t)
}

// linkState renders what the kernel holds for o: the host end (type,
// alias, up, addresses, rp_filter) and the netns end (addresses, up,
// routes), as text the tests compare whole.
func linkState(t *testing.T, o Owner, ns netns.NsHandle) string {
	t.Helper()
	root, err := netlink.NewHandle()
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	in, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	var b strings.Builder
	one := func(h *netlink.Handle, name string) netlink.Link {
		l, err := h.LinkByName(name)
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", name, err)
			return nil
		}
		a := l.Attrs()
		fmt.Fprintf(&b, "%s: %s alias=%q up=%v", name, l.Type(), a.Alias, a.Flags&net.FlagUp != 0)
		as, err := h.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			t.Fatal(err)
		}
		for _, ad := range as {
			if ad.IP.IsLinkLocalUnicast() {
				continue
			}
			fmt.Fprintf(&b, " %v", ad.IPNet)
			if ad.IP.To4() == nil {
				fmt.Fprintf(&b, "(nodad=%v,tentative=%v)", ad.Flags&unix.IFA_F_NODAD != 0, ad.Flags&unix.IFA_F_TENTATIVE != 0)
			}
		}
		b.WriteString("\n")
		return l
	}
	if one(root, o.Link()) != nil {
		rp, err := os.ReadFile(filepath.Join("/proc/sys/net/ipv4/conf", o.Link(), "rp_filter"))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "rp_filter=%s\n", strings.TrimSpace(string(rp)))
	}
	if peer := one(in, PeerName); peer != nil {
		rs, err := in.RouteList(peer, netlink.FAMILY_ALL)
		if err != nil {
			t.Fatal(err)
		}
		var routes []string
		for _, r := range rs {
			if r.Gw != nil && (r.Dst == nil || r.Dst.IP.IsUnspecified() && net.IP(r.Dst.Mask).IsUnspecified()) {
				routes = append(routes, "default via "+r.Gw.String())
			}
		}
		slices.Sort(routes)
		fmt.Fprintf(&b, "routes: %s\n", strings.Join(routes, ", "))
	}
	return b.String()
}

func wantState(o Owner) string {
	b := o.Block
	return fmt.Sprintf(`%s: veth alias=%q up=true %v/31 %v/126(nodad=true,tentative=false)
rp_filter=1
eth0: veth alias="" up=true %v/31 %v/126(nodad=true,tentative=false)
routes: default via %v, default via %v
`, o.Link(), o.Alias(), b.Gateway4, b.Gateway6, b.Addr4, b.Addr6, b.Gateway4, b.Gateway6)
}

// dialFrom connects from inside ns to addr and returns the echo of "hi".
func dialFrom(ns ktest.Netns, addr netip.AddrPort) (string, error) {
	var got string
	err := ns.Do(func() error {
		c, err := net.DialTimeout("tcp", addr.String(), 3*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Write([]byte("hi\n")); err != nil {
			return err
		}
		got, err = bufio.NewReader(c).ReadString('\n')
		return err
	})
	return got, err
}

// echoOn serves one-line TCP echoes on addr in the test's (root) netns.
func echoOn(t *testing.T, addr netip.AddrPort) {
	t.Helper()
	ln, err := net.Listen("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			l, _ := bufio.NewReader(c).ReadString('\n')
			fmt.Fprintf(c, "%s from %v\n", strings.TrimSpace(l), c.RemoteAddr())
			c.Close()
		}
	}()
}

func TestKernelLinksLifecycle(t *testing.T) {
	ctx, l := kernelLinks(t)
	ns := ktest.NewNetns(t)
	o := testOwner(t, "sb-links", 3)
	t.Cleanup(func() { _ = l.Remove(ctx, o.Link()) })

	if ok, detail := l.CheckGone(ctx, o); !ok {
		t.Fatalf("CheckGone before Make: %s", detail)
	}
	if err := l.Make(ctx, o, ns.Path); err != nil {
		t.Fatal(err)
	}
	if got, want := linkState(t, o, ns.Handle), wantState(o); got != want {
		t.Errorf("after Make:\n%s\nwant:\n%s", got, want)
	}
	host, err := netlink.LinkByName(o.Link())
	if err != nil {
		t.Fatal(err)
	}
	// Idempotent: the same pair, nothing added.
	if err := l.Make(ctx, o, ns.Path); err != nil {
		t.Fatalf("second Make: %v", err)
	}
	if got, want := linkState(t, o, ns.Handle), wantState(o); got != want {
		t.Errorf("after second Make:\n%s\nwant:\n%s", got, want)
	}
	if again, err := netlink.LinkByName(o.Link()); err != nil || again.Attrs().Index != host.Attrs().Index {
		t.Errorf("second Make replaced the link (index %d, now %v, %v)", host.Attrs().Index, again, err)
	}

	// The pair carries traffic both ways, v4 and v6: the netns reaches a
	// listener on each gateway in the root netns and is seen by its own
	// address.
	for _, gw := range []netip.Addr{o.Block.Gateway4, o.Block.Gateway6} {
		echoOn(t, netip.AddrPortFrom(gw, 7777))
		got, err := dialFrom(ns, netip.AddrPortFrom(gw, 7777))
		src := o.Block.Addr4
		if gw.Is6() {
			src = o.Block.Addr6
		}
		if want := "hi from " + strings.TrimSuffix(netip.AddrPortFrom(src, 0).String(), "0"); err != nil || !strings.HasPrefix(got, want) {
			t.Errorf("netns -> %v: %q, %v (want an echo from %v)", gw, got, err, src)
		}
	}

	names, err := l.List(ctx)
	if err != nil || !slices.Contains(names, o.Link()) {
		t.Errorf("List = %q, %v; want it to hold %s", names, err, o.Link())
	}
	ok, detail := l.CheckGone(ctx, o)
	for _, want := range []string{"link " + o.Link(), "address " + o.Block.Gateway4.String(), "address " + o.Block.Gateway6.String()} {
		if ok || !strings.Contains(detail, want) {
			t.Errorf("CheckGone with the pair = %v %q; want false naming %q", ok, detail, want)
		}
	}

	if err := l.Remove(ctx, o.Link()); err != nil {
		t.Fatal(err)
	}
	if err := l.Remove(ctx, o.Link()); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
	if ok, detail := l.CheckGone(ctx, o); !ok {
		t.Errorf("CheckGone after Remove: %s", detail)
	}
	if names, err := l.List(ctx); err != nil || slices.Contains(names, o.Link()) {
		t.Errorf("List after Remove = %q, %v", names, err)
	}
	// The peer went with the host end.
	if in, err := netlink.NewHandleAt(ns.Handle); err != nil {
		t.Fatal(err)
	} else {
		if _, err := in.LinkByName(PeerName); err == nil {
			t.Errorf("%s is still in the netns after Remove", PeerName)
		}
		in.Close()
	}
}

// TestKernelLinksCheckGoneAlias: a link of another name with the
// generation's alias, or an address of its block on any link, is a leak.
func TestKernelLinksCheckGoneAlias(t *testing.T) {
	ctx, l := kernelLinks(t)
	o := testOwner(t, "sb-alias", 4)
	d := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: "kt-alias"}}
	if err := netlink.LinkAdd(d); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(d) })
	if err := netlink.LinkSetAlias(d, o.Alias()); err != nil {
		t.Fatal(err)
	}
	if ok, detail := l.CheckGone(ctx, o); ok || !strings.Contains(detail, `link kt-alias has the alias "sb-alias-g1"`) {
		t.Errorf("CheckGone with an aliased link = %v %q", ok, detail)
	}
	if err := netlink.LinkSetAlias(d, ""); err != nil {
		t.Fatal(err)
	}
	if err := netlink.AddrAdd(d, &netlink.Addr{IPNet: ipNet(o.Block.Addr4, 32)}); err != nil {
		t.Fatal(err)
	}
	if ok, detail := l.CheckGone(ctx, o); ok || detail != fmt.Sprintf("address %v is on link kt-alias", o.Block.Addr4) {
		t.Errorf("CheckGone with a block address = %v %q", ok, detail)
	}
	if err := netlink.LinkDel(d); err != nil {
		t.Fatal(err)
	}
	if ok, detail := l.CheckGone(ctx, o); !ok {
		t.Errorf("CheckGone after the dummy went: %s", detail)
	}
}

// TestKernelLinksRetry: Make completes or replaces what a crashed Make
// left, and refuses to touch another generation's link.
func TestKernelLinksRetry(t *testing.T) {
	ctx, l := kernelLinks(t)

	cases := []struct {
		name string
		// leave makes what a crash left, given the owner and its netns
		// (and a second netns of the test's); it returns the host end's
		// index if Make must keep that link.
		leave func(t *testing.T, o Owner, ns, other ktest.Netns) (keep int)
	}{
		{"bare pair, no alias or addresses", func(t *testing.T, o Owner, ns, other ktest.Netns) int {
			v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: o.Link()}, PeerName: PeerName, PeerNamespace: netlink.NsFd(int(ns.Handle))}
			if err := netlink.LinkAdd(v); err != nil {
				t.Fatal(err)
			}
			h, err := netlink.LinkByName(o.Link())
			if err != nil {
				t.Fatal(err)
			}
			return h.Attrs().Index
		}},
		{"pair with the alias and host addresses, peer down", func(t *testing.T, o Owner, ns, other ktest.Netns) int {
			v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: o.Link()}, PeerName: PeerName, PeerNamespace: netlink.NsFd(int(ns.Handle))}
			if err := netlink.LinkAdd(v); err != nil {
				t.Fatal(err)
			}
			h, err := netlink.LinkByName(o.Link())
			if err != nil {
				t.Fatal(err)
			}
			if err := netlink.LinkSetAlias(h, o.Alias()); err != nil {
				t.Fatal(err)
			}
			if err := netlink.AddrAdd(h, &netlink.Addr{IPNet: ipNet(o.Block.Gateway4, 31)}); err != nil {
				t.Fatal(err)
			}
			return h.Attrs().Index
		}},
		{"pair whose peer is in another netns", func(t *testing.T, o Owner, ns, other ktest.Netns) int {
			v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: o.Link()}, PeerName: PeerName, PeerNamespace: netlink.NsFd(int(other.Handle))}
			if err := netlink.LinkAdd(v); err != nil {
				t.Fatal(err)
			}
			return 0
		}},
		{"a veth whose peer is in the root netns", func(t *testing.T, o Owner, ns, other ktest.Netns) int {
			v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: o.Link()}, PeerName: "kt-rootpeer"}
			if err := netlink.LinkAdd(v); err != nil {
				t.Fatal(err)
			}
			// An eth0 in the sandbox's netns that is not its peer.
			staleEth0(t, ns)
			return 0
		}},
		{"a dummy of the link's name", func(t *testing.T, o Owner, ns, other ktest.Netns) int {
			if err := netlink.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: o.Link()}}); err != nil {
				t.Fatal(err)
			}
			return 0
		}},
		{"a stale eth0 in the netns, no host end", func(t *testing.T, o Owner, ns, other ktest.Netns) int {
			staleEth0(t, ns)
			return 0
		}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ns, other := ktest.NewNetns(t), ktest.NewNetns(t)
			o := testOwner(t, "sb-retry", Slot(10+i))
			t.Cleanup(func() { _ = l.Remove(ctx, o.Link()) })
			keep := c.leave(t, o, ns, other)
			if err := l.Make(ctx, o, ns.Path); err != nil {
				t.Fatalf("Make over the leftover: %v", err)
			}
			if got, want := linkState(t, o, ns.Handle), wantState(o); got != want {
				t.Errorf("after Make:\n%s\nwant:\n%s", got, want)
			}
			h, err := netlink.LinkByName(o.Link())
			if err != nil {
				t.Fatal(err)
			}
			if keep != 0 && h.Attrs().Index != keep {
				t.Errorf("Make replaced a pair it should have completed (index %d, was %d)", h.Attrs().Index, keep)
			}
			// The other netns has nothing of the owner's left.
			oh, err := netlink.NewHandleAt(other.Handle)
			if err != nil {
				t.Fatal(err)
			}
			defer oh.Close()
			if _, err := oh.LinkByName(PeerName); err == nil {
				t.Errorf("the other netns still has %s", PeerName)
			}
			if _, err := dialFrom(ns, netip.AddrPortFrom(o.Block.Gateway4, 1)); !errors.Is(err, unix.ECONNREFUSED) {
				t.Errorf("netns -> gateway port 1: %v, want connection refused (the path works)", err)
			}
		})
	}

	t.Run("another owner's link", func(t *testing.T) {
		ns := ktest.NewNetns(t)
		o := testOwner(t, "sb-retry", 20)
		theirs := Owner{ID: "sb-other", Generation: 7, Block: o.Block}
		t.Cleanup(func() { _ = l.Remove(ctx, o.Link()) })
		if err := l.Make(ctx, theirs, ktest.NewNetns(t).Path); err != nil {
			t.Fatal(err)
		}
		before, _ := netlink.LinkByName(o.Link())
		err := l.Make(ctx, o, ns.Path)
		if !errdefs.Is(err, errdefs.CodeConflict) {
			t.Fatalf("Make over another owner's link: %v, want conflict", err)
		}
		after, err2 := netlink.LinkByName(o.Link())
		if err2 != nil || after.Attrs().Index != before.Attrs().Index || after.Attrs().Alias != theirs.Alias() {
			t.Errorf("the other owner's link changed: %v %v", after, err2)
		}
	})
}

// TestKernelLinksRunscGuest proves the plumbing for what it is for: a
// gVisor guest (runsc --network=sandbox) in a netns with an IPv4 /31 and
// an IPv6 /126 reaches a listener on its gateway, and, with forwarding
// on, a test host beyond the node, which sees the sandbox's own address.
func TestKernelLinksRunscGuest(t *testing.T) {
	ktest.RequireBinary(t, "runsc")
	tmp := t.TempDir()
	rt := &runsc.Runtime{Root: filepath.Join(tmp, "runsc"), LogDir: filepath.Join(tmp, "logs")}
	rt.Version, _ = runsc.Version(context.Background(), "runsc") // the build on PATH (make RUNSC=...)
	ktest.CheckLeaks(t, ktest.SnapshotOptions{RunscRoots: []string{rt.Root}})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	l := testLinks(t)
	if err := l.EnableForwarding(ctx, true); err != nil {
		t.Fatal(err)
	}
	th := ktest.NewTestHost(t, ktest.TestHostOptions{})
	ns := ktest.NewNetns(t)
	o := testOwner(t, "sb-guest", 5)
	t.Cleanup(func() { _ = l.Remove(ctx, o.Link()) })
	if err := l.Make(ctx, o, ns.Path); err != nil {
		t.Fatal(err)
	}
	echoOn(t, netip.AddrPortFrom(o.Block.Gateway4, 7777))
	echoOn(t, netip.AddrPortFrom(o.Block.Gateway6, 7777))

	const id = "nt-guest"
	rootfs, bundle := filepath.Join(tmp, "rootfs"), filepath.Join(tmp, "bundle")
	if err := template.BuildBusybox(rootfs, "/bin/busybox"); err != nil {
		t.Fatal(err)
	}
	s, err := runsc.BuildSpec(runsc.BundleSpec{ContainerID: id, RootPath: rootfs, Hostname: id, NetnsPath: ns.Path, Args: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := runsc.WriteBundle(bundle, s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
		defer dcancel()
		if err := rt.Delete(dctx, id); err != nil {
			t.Errorf("delete guest: %v", err)
		}
	})
	if err := rt.Create(ctx, id, bundle); err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	guest := func(cmd string) string {
		var out bytes.Buffer
		code, err := rt.Exec(ctx, id, runsc.ExecProcess{Args: []string{"sh", "-c", cmd}}, nil, &out, &out)
		if err != nil {
			t.Fatalf("exec %q: %v", cmd, err)
		}
		return fmt.Sprintf("%s[exit %d]", out.String(), code)
	}
	b := o.Block
	for _, c := range []struct{ dst, want string }{
		{b.Gateway4.String() + " 7777", "hi from " + b.Addr4.String() + ":"},
		{b.Gateway6.String() + " 7777", "hi from [" + b.Addr6.String() + "]:"},
		{th.Addr4.String() + " 8080", "hi from " + b.Addr4.String() + ":"},
		{th.Other4.String() + " 8081", "hi from " + b.Addr4.String() + ":"},
		{th.Addr6.String() + " 8080", "hi from [" + b.Addr6.String() + "]:"},
	} {
		if got := guest("echo hi | nc -w 5 " + c.dst); !strings.HasPrefix(got, c.want) {
			t.Errorf("guest -> %s: %q, want %q...", c.dst, got, c.want)
		}
	}
	// busybox's nc has no UDP; tftp sends one datagram (the host's echo
	// is no tftp answer, so tftp fails: the hit is the proof).
	guest("timeout 3 tftp -g -r probe -l /dev/null " + th.Addr4.String() + " 5353")
	want := []string{"tcp " + th.Addr4.String() + ":8080", "tcp " + th.Other4.String() + ":8081", "udp " + th.Addr4.String() + ":5353"}
	var got []string
	for _, h := range th.HitsFrom(b.Addr4) {
		got = append(got, h.Proto+" "+h.Local.String())
	}
	got = slices.Compact(got) // tftp repeats its datagram
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("test host hits from %v = %q, want %q (all: %v)", b.Addr4, got, want, th.Hits())
	}
	if err := rt.Kill(ctx, id, unix.SIGKILL, false); err != nil {
		t.Fatal(err)
	}
}

// TestKernelLinksMany makes and removes pairs for many generations side by
// side: each is complete and independent, List names exactly them, and
// Make's time does not grow with the number of links (logged: p50/p99 of
// the first and the last fifth).
func TestKernelLinksMany(t *testing.T) {
	ktest.Require(t)
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})
	ctx := context.Background()
	l := &Links{} // quiet: 2 log lines per pair would drown the output
	const n = 100
	owners := make([]Owner, n)
	nss := make([]ktest.Netns, n)
	made := make([]time.Duration, n)
	for i := range n {
		owners[i] = testOwner(t, fmt.Sprintf("sb-many-%d", i), Slot(100+i))
		nss[i] = ktest.NewNetns(t)
		o := owners[i]
		t.Cleanup(func() { _ = l.Remove(ctx, o.Link()) })
		t0 := time.Now()
		if err := l.Make(ctx, o, nss[i].Path); err != nil {
			t.Fatalf("Make %d: %v", i, err)
		}
		made[i] = time.Since(t0)
	}
	names, err := l.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, o := range owners {
		want = append(want, o.Link())
	}
	if !slices.Equal(names, want) {
		t.Errorf("List = %q, want %q", names, want)
	}
	for _, i := range []int{0, n / 2, n - 1} {
		if got := linkState(t, owners[i], nss[i].Handle); got != wantState(owners[i]) {
			t.Errorf("pair %d:\n%s\nwant:\n%s", i, got, wantState(owners[i]))
		}
	}
	pct := func(ds []time.Duration, p int) time.Duration {
		ds = slices.Clone(ds)
		slices.Sort(ds)
		return ds[(len(ds)-1)*p/100]
	}
	first, last := made[:n/5], made[n-n/5:]
	t.Logf("Make with 0..%d links: p50 %v p99 %v; with %d..%d links: p50 %v p99 %v", n/5, pct(first, 50), pct(first, 99), n-n/5, n, pct(last, 50), pct(last, 99))
	removed := make([]time.Duration, n)
	for i, o := range owners {
		t0 := time.Now()
		if err := l.Remove(ctx, o.Link()); err != nil {
			t.Fatalf("Remove %d: %v", i, err)
		}
		removed[i] = time.Since(t0)
		if ok, detail := l.CheckGone(ctx, o); !ok {
			t.Errorf("CheckGone %d: %s", i, detail)
		}
	}
	t.Logf("Remove: p50 %v p99 %v", pct(removed, 50), pct(removed, 99))
	if names, err := l.List(ctx); err != nil || len(names) != 0 {
		t.Errorf("List after removing all = %q, %v", names, err)
	}
}
