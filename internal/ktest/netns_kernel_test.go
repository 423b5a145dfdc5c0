package ktest

import (
	"errors"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// serveOnce listens on addr inside ns and answers one connection with "ok".
func serveOnce(t *testing.T, ns Netns, addr string) string {
	t.Helper()
	var ln net.Listener
	if err := ns.Do(func() (err error) { ln, err = net.Listen("tcp4", net.JoinHostPort(addr, "0")); return err }); err != nil {
		t.Fatalf("listen on %s in %s: %v", addr, ns.Path, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_, _ = c.Write([]byte("ok"))
			c.Close()
		}
	}()
	return ln.Addr().String()
}

func dial(addr string) error {
	c, err := net.DialTimeout("tcp4", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c)
	if err == nil && string(b) != "ok" {
		err = errors.New("read " + string(b))
	}
	return err
}

// TestNewNetnsAndVethPair: NewNetns makes a netns of its own, bound on its
// path with lo up; VethPair links two of them, or one and the test's own
// netns, addressed and up, and TCP flows over both pairs; when the test
// ends the helpers have removed every mount, link and fd they made.
func TestNewNetnsAndVethPair(t *testing.T) {
	Require(t)
	CheckLeaks(t, SnapshotOptions{})
	var a, b Netns
	t.Run("make", func(t *testing.T) {
		a, b = NewNetns(t), NewNetns(t)
		self, err := netns.Get()
		if err != nil {
			t.Fatal(err)
		}
		defer self.Close()
		var path, handle unix.Stat_t
		if err := unix.Stat(a.Path, &path); err != nil {
			t.Fatal(err)
		}
		if err := unix.Fstat(int(a.Handle), &handle); err != nil {
			t.Fatal(err)
		}
		if path.Ino != handle.Ino || path.Dev != handle.Dev {
			t.Fatalf("%s is not bound to the handle's netns (inode %d, handle %d)", a.Path, path.Ino, handle.Ino)
		}
		if a.Handle.Equal(self) || a.Handle.Equal(b.Handle) {
			t.Fatal("NewNetns did not make a netns of its own")
		}
		h, err := netlink.NewHandleAt(a.Handle)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		if lo, err := h.LinkByName("lo"); err != nil || lo.Attrs().Flags&net.FlagUp == 0 {
			t.Fatalf("lo in the new netns: %v, %v; want up", lo, err)
		}

		VethPair(t, Veth{Netns: a.Handle, Name: "ktva", Addr: "10.203.0.1/30"}, Veth{Netns: b.Handle, Name: "ktvb", Addr: "10.203.0.2/30"})
		VethPair(t, Veth{Netns: netns.None(), Name: "ktvh", Addr: "10.203.0.5/30"}, Veth{Netns: a.Handle, Name: "ktvp", Addr: "10.203.0.6/30"})
		if _, err := net.InterfaceByName("ktvh"); err != nil {
			t.Fatalf("host end of the pair with the test's netns: %v", err)
		}
		if _, err := net.InterfaceByName("ktva"); err == nil {
			t.Fatal("ktva is in the test's netns, want it in a")
		}
		// b answers a; a answers the test's own netns.
		inB := serveOnce(t, b, "10.203.0.2")
		var err2 error
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			// The first dial may race the carrier coming up.
			if err2 = a.Do(func() error { return dial(inB) }); err2 == nil || time.Now().After(deadline) {
				break
			}
		}
		if err2 != nil {
			t.Fatalf("a -> b over the veth pair: %v", err2)
		}
		inA := serveOnce(t, a, "10.203.0.6")
		if err := dial(inA); err != nil {
			t.Fatalf("test netns -> a over the veth pair: %v", err)
		}
	})
	mounts, err := mountPoints()
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []Netns{a, b} {
		if ns.Path == "" {
			t.Fatal("the make subtest made no netns")
		}
		if slices.Contains(mounts, ns.Path) {
			t.Errorf("%s still mounted after its test ended", ns.Path)
		}
	}
	if _, err := net.InterfaceByName("ktvh"); err == nil {
		t.Error("veth ktvh left in the test's netns after its test ended")
	}
}
