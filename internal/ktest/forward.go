package ktest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"
)

// Forwarding turns IPv4 and IPv6 forwarding on in the calling thread's
// netns (the VM's root netns: the node's) and restores the old values
// when the test ends.
func Forwarding(t testing.TB) {
	t.Helper()
	for _, fwd := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
		old, err := os.ReadFile(fwd)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(fwd, []byte("1"), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.WriteFile(fwd, old, 0o644) })
	}
}

// EchoTCP echoes every connection accepted on ln until the test ends,
// then closes ln and the accepted connections: one whose client a
// firewall cut off never sees its FIN.
func EchoTCP(t testing.TB, ln net.Listener) {
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
}

// GreetTCP listens on TCP port on every address of the calling thread's
// netns and writes line to each connection, then closes it, until the
// test ends: a service on the node a guest's probe may or may not reach.
func GreetTCP(t testing.TB, port uint16, line string) {
	t.Helper()
	ln, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, line)
			_ = c.Close()
		}
	}()
}

// LinkAddrs are the addresses of every link of the calling thread's netns
// (the VM's root netns: the node's), IPv4 ones unmapped.
func LinkAddrs(t testing.TB) []netip.Addr {
	t.Helper()
	// A dump interrupted by a concurrent change may be incomplete: again.
	as, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	for i := 0; errors.Is(err, netlink.ErrDumpInterrupted) && i < 5; i++ {
		as, err = netlink.AddrList(nil, netlink.FAMILY_ALL)
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []netip.Addr
	for _, a := range as {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out
}
