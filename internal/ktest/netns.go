package ktest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Netns is a network namespace of one test: Path is the file it is
// bind-mounted on (runsc joins it by path, `nsenter --net=Path` enters it),
// Handle an open fd of it.
type Netns struct {
	Path   string
	Handle netns.NsHandle
}

// NewNetns makes a fresh netns that only this test knows, bind-mounted on
// a file in a temp dir (not /run/netns, whose first use leaves a mount
// behind), with its loopback up. Cleanup unmounts it and closes the
// handle, so the netns goes once nothing else holds it.
func NewNetns(t testing.TB) Netns {
	t.Helper()
	p := filepath.Join(t.TempDir(), "netns")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	type res struct {
		h   netns.NsHandle
		err error
	}
	c := make(chan res, 1)
	go func() {
		// Unsharing changes the calling thread only. The thread stays
		// locked, so the runtime discards it when the goroutine ends
		// instead of reusing a thread in the new netns.
		runtime.LockOSThread()
		h, err := netns.New()
		c <- res{h, err}
	}()
	r := <-c
	if r.err != nil {
		t.Fatalf("new netns: %v", r.err)
	}
	t.Cleanup(func() { _ = r.h.Close() })
	if err := unix.Mount(fmt.Sprintf("/proc/self/fd/%d", int(r.h)), p, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind netns on %s: %v", p, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			t.Errorf("unmount netns %s: %v", p, err)
		}
	})
	h, err := netlink.NewHandleAt(r.h)
	if err != nil {
		t.Fatalf("netlink in netns: %v", err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatalf("find lo in netns: %v", err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		t.Fatalf("set lo up in netns: %v", err)
	}
	return Netns{Path: p, Handle: r.h}
}

// Do runs fn on a locked OS thread switched into n (for the calls that act
// on the calling thread's netns: listen, dial). The thread goes back to its
// original netns afterwards; if that fails it stays locked, so the runtime
// discards it instead of reusing a thread in the wrong netns.
func (n Netns) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("get current netns: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(n.Handle); err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", n.Path, err)
			return
		}
		err = fn()
		if rerr := netns.Set(orig); rerr != nil {
			errc <- errors.Join(err, fmt.Errorf("restore netns: %w", rerr))
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// Veth is one end of a veth pair: the netns it is in (netns.None() is the
// test's own), its name and its address (CIDR).
type Veth struct {
	Netns netns.NsHandle
	Name  string
	Addr  string
}

// VethPair links a and b with a veth pair, addresses both ends and brings
// them up. Cleanup deletes the pair (deleting one end removes both).
func VethPair(t testing.TB, a, b Veth) {
	t.Helper()
	ha, err := netlink.NewHandleAt(a.Netns)
	if err != nil {
		t.Fatalf("netlink handle for %s: %v", a.Name, err)
	}
	t.Cleanup(ha.Close)
	hb, err := netlink.NewHandleAt(b.Netns)
	if err != nil {
		t.Fatalf("netlink handle for %s: %v", b.Name, err)
	}
	t.Cleanup(hb.Close)
	var peerNs any = netlink.NsFd(int(b.Netns))
	if !b.Netns.IsOpen() {
		peerNs = netlink.NsPid(os.Getpid())
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: a.Name}, PeerName: b.Name, PeerNamespace: peerNs}
	if err := ha.LinkAdd(veth); err != nil {
		t.Fatalf("add veth %s/%s: %v", a.Name, b.Name, err)
	}
	t.Cleanup(func() {
		l, err := ha.LinkByName(a.Name)
		if err != nil {
			// Already gone (with its netns, or deleted by the test).
			var nf netlink.LinkNotFoundError
			if !errors.As(err, &nf) {
				t.Errorf("find veth %s: %v", a.Name, err)
			}
			return
		}
		if err := ha.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
			t.Errorf("delete veth %s: %v", a.Name, err)
		}
	})
	for _, e := range []struct {
		h *netlink.Handle
		Veth
	}{{ha, a}, {hb, b}} {
		l, err := e.h.LinkByName(e.Name)
		if err != nil {
			t.Fatalf("find %s: %v", e.Name, err)
		}
		addr, err := netlink.ParseAddr(e.Addr)
		if err != nil {
			t.Fatalf("parse %s: %v", e.Addr, err)
		}
		if err := e.h.AddrAdd(l, addr); err != nil {
			t.Fatalf("add %s to %s: %v", e.Addr, e.Name, err)
		}
		if err := e.h.LinkSetUp(l); err != nil {
			t.Fatalf("set %s up: %v", e.Name, err)
		}
	}
}
