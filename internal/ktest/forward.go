package ktest

import (
	"io"
	"net"
	"os"
	"sync"
	"testing"
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
