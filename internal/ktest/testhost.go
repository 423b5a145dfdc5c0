package ktest

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Test hosts: destinations for network scenario tests (a sandbox's guest
// connects to them through the node's forwarding and firewall). Each is a
// netns of the test's own joined to the test's netns (the node's root
// netns in the VM) by a veth, with addresses outside any sandbox pool and
// outside the private ranges (the RFC 2544 benchmark range 198.18.0.0/15
// and the documentation prefix 2001:db8::/32), so a policy treats them as
// public destinations.
//
// Addresses of test host number i (1..MaxTestHosts), claimed race-free by
// the root-side link name "kth<i>":
//
//	root side (Gateway4)        198.18.<i/128>.<(i%128)*2>/31 on kth<i>
//	host side (Addr4)           the odd address of that /31 on eth0
//	second address (Other4)     198.19.<i/256>.<i%256>/32 on the host's lo,
//	                            routed from the root netns via Addr4
//	IPv6: Gateway6/Addr6        2001:db8:c7:<i>::1 and ::2 /126 (nodad)
//	      Other6                2001:db8:c8:<i>::1/128 on lo, routed
//
// The host's default routes point back at the root side, so it answers
// sandboxes whose traffic the root netns forwards (which needs
// net.ipv4.ip_forward; the helper does not turn it on).

// MaxTestHosts bounds the index of a test host.
const MaxTestHosts = 1000

// Default echo ports of a test host.
var (
	DefaultTCPPorts = []uint16{8080, 8081}
	DefaultUDPPorts = []uint16{5353, 5354}
)

// TestHostOptions say which echo servers a test host runs; nil means the
// defaults.
type TestHostOptions struct {
	TCP, UDP []uint16
}

// TestHost is a running test host. Its TCP servers answer every line
// received with the line, " from ", and the peer's address
// ("hello from 10.200.0.3:41234"); its UDP servers answer every datagram
// the same way. Every connection and datagram is recorded (Hits), so a
// test can prove that nothing arrived.
type TestHost struct {
	Netns Netns
	// Link is the root-side end of the host's veth.
	Link                    string
	Gateway4, Addr4, Other4 netip.Addr
	Gateway6, Addr6, Other6 netip.Addr
	TCP, UDP                []uint16

	mu    sync.Mutex
	hits  []Hit
	lines []Line
	// stop closes the servers; wg waits for their goroutines.
	stop []func()
	wg   sync.WaitGroup
}

// Hit is one TCP connection accepted or UDP datagram received by a test
// host.
type Hit struct {
	Proto string // "tcp" or "udp"
	Local netip.AddrPort
	From  netip.AddrPort
}

func (h Hit) String() string { return fmt.Sprintf("%s %v <- %v", h.Proto, h.Local, h.From) }

// Line is one line a test host's TCP server received (and echoed), in the
// order its connection delivered them: a test can prove that a connection
// stopped carrying data.
type Line struct {
	Local, From netip.AddrPort
	Text        string
}

// Lines returns the lines the host's TCP servers received so far.
func (h *TestHost) Lines() []Line {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Line(nil), h.lines...)
}

// Hits returns what the host's servers received so far.
func (h *TestHost) Hits() []Hit {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Hit(nil), h.hits...)
}

// HitsFrom returns the hits whose peer address is a.
func (h *TestHost) HitsFrom(a netip.Addr) []Hit {
	var out []Hit
	for _, x := range h.Hits() {
		if x.From.Addr().Unmap() == a {
			out = append(out, x)
		}
	}
	return out
}

func (h *TestHost) hit(proto string, local, from net.Addr) {
	x := Hit{Proto: proto, Local: addrPort(local), From: addrPort(from)}
	h.mu.Lock()
	h.hits = append(h.hits, x)
	h.mu.Unlock()
}

func addrPort(a net.Addr) netip.AddrPort {
	switch a := a.(type) {
	case *net.TCPAddr:
		ap := a.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	case *net.UDPAddr:
		ap := a.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}

// testHostAddrs returns the addresses of test host i.
func testHostAddrs(i int) (gw4, a4, o4, gw6, a6, o6 netip.Addr) {
	gw4 = netip.AddrFrom4([4]byte{198, 18, byte(i / 128), byte(i % 128 * 2)})
	a4 = gw4.Next()
	o4 = netip.AddrFrom4([4]byte{198, 19, byte(i / 256), byte(i % 256)})
	gw6 = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 0xc7, byte(i >> 8), byte(i), 15: 1})
	a6 = gw6.Next()
	o6 = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 0xc8, byte(i >> 8), byte(i), 15: 1})
	return
}

// NewTestHost starts a test host. Cleanup stops its servers, deletes its
// veth and its netns; the host is gone when the test ends.
func NewTestHost(t testing.TB, opts TestHostOptions) *TestHost {
	t.Helper()
	Require(t)
	h := &TestHost{TCP: opts.TCP, UDP: opts.UDP}
	if h.TCP == nil {
		h.TCP = DefaultTCPPorts
	}
	if h.UDP == nil {
		h.UDP = DefaultUDPPorts
	}
	h.Netns = NewNetns(t)
	root, err := netlink.NewHandle()
	if err != nil {
		t.Fatalf("netlink: %v", err)
	}
	t.Cleanup(root.Close)
	in, err := netlink.NewHandleAt(h.Netns.Handle)
	if err != nil {
		t.Fatalf("netlink in test host netns: %v", err)
	}
	t.Cleanup(in.Close)

	// Claim an index by its link name: LinkAdd is atomic, so concurrent
	// test binaries in one VM never share one.
	var i int
	for i = 1; ; i++ {
		if i > MaxTestHosts {
			t.Fatalf("test host: all %d indexes are taken", MaxTestHosts)
		}
		h.Link = fmt.Sprintf("kth%d", i)
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: h.Link}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(h.Netns.Handle))}
		err := root.LinkAdd(veth)
		if errors.Is(err, unix.EEXIST) {
			continue
		}
		if err != nil {
			t.Fatalf("test host: add veth %s: %v", h.Link, err)
		}
		break
	}
	t.Cleanup(func() {
		l, err := root.LinkByName(h.Link)
		if err != nil {
			return // gone with its netns
		}
		if err := root.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
			t.Errorf("test host: delete veth %s: %v", h.Link, err)
		}
	})
	h.Gateway4, h.Addr4, h.Other4, h.Gateway6, h.Addr6, h.Other6 = testHostAddrs(i)

	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("test host %s: %s: %v", h.Link, what, err)
		}
	}
	outer, err := root.LinkByName(h.Link)
	must("find root end", err)
	eth0, err := in.LinkByName("eth0")
	must("find eth0", err)
	lo, err := in.LinkByName("lo")
	must("find lo", err)
	add := func(hd *netlink.Handle, l netlink.Link, a netip.Addr, bits int) {
		t.Helper()
		na := &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, a.BitLen())}}
		if a.Is6() {
			na.Flags = unix.IFA_F_NODAD
		}
		must(fmt.Sprintf("add %v/%d to %s", a, bits, l.Attrs().Name), hd.AddrAdd(l, na))
	}
	add(root, outer, h.Gateway4, 31)
	add(root, outer, h.Gateway6, 126)
	add(in, eth0, h.Addr4, 31)
	add(in, eth0, h.Addr6, 126)
	add(in, lo, h.Other4, 32)
	add(in, lo, h.Other6, 128)
	must("set root end up", root.LinkSetUp(outer))
	must("set eth0 up", in.LinkSetUp(eth0))
	for _, r := range []*netlink.Route{
		{LinkIndex: eth0.Attrs().Index, Gw: h.Gateway4.AsSlice()},
		{LinkIndex: eth0.Attrs().Index, Gw: h.Gateway6.AsSlice()},
	} {
		must(fmt.Sprintf("route via %v", r.Gw), in.RouteAdd(r))
	}
	for _, r := range []*netlink.Route{
		{LinkIndex: outer.Attrs().Index, Dst: &net.IPNet{IP: h.Other4.AsSlice(), Mask: net.CIDRMask(32, 32)}, Gw: h.Addr4.AsSlice()},
		{LinkIndex: outer.Attrs().Index, Dst: &net.IPNet{IP: h.Other6.AsSlice(), Mask: net.CIDRMask(128, 128)}, Gw: h.Addr6.AsSlice()},
	} {
		// Goes with the link when it is deleted.
		must(fmt.Sprintf("route to %v", r.Dst), root.RouteAdd(r))
	}

	t.Cleanup(func() {
		for _, c := range h.stop {
			c()
		}
		h.wg.Wait()
	})
	err = h.Netns.Do(func() error {
		for _, p := range h.TCP {
			ln, err := net.Listen("tcp", fmt.Sprintf(":%d", p))
			if err != nil {
				return err
			}
			h.stop = append(h.stop, serveTCP(h, ln, &h.wg))
		}
		return h.listenUDP(h.Addr4, h.Other4, h.Addr6, h.Other6)
	})
	must("start echo servers", err)
	return h
}

// listenUDP starts a UDP echo server on each port of h.UDP at each of
// addrs, one socket per address, so a hit says which was reached (a
// wildcard socket does not know a datagram's destination). It runs inside
// the host's netns.
func (h *TestHost) listenUDP(addrs ...netip.Addr) error {
	for _, p := range h.UDP {
		for _, a := range addrs {
			pc, err := net.ListenPacket("udp", netip.AddrPortFrom(a, p).String())
			if err != nil {
				return err
			}
			h.stop = append(h.stop, func() { pc.Close() })
			h.wg.Add(1)
			go func() {
				defer h.wg.Done()
				serveUDP(h, pc)
			}()
		}
	}
	return nil
}

// AddAddr gives the host one more address (on its lo, routed from the
// test's netns via Addr4 or Addr6), served like the others: for a test
// that needs a destination at a given address, e.g. the metadata service's
// 169.254.169.254, so that only a firewall keeps a sandbox from it.
func (h *TestHost) AddAddr(t testing.TB, a netip.Addr) {
	t.Helper()
	root, err := netlink.NewHandle()
	if err != nil {
		t.Fatalf("netlink: %v", err)
	}
	defer root.Close()
	in, err := netlink.NewHandleAt(h.Netns.Handle)
	if err != nil {
		t.Fatalf("netlink in test host netns: %v", err)
	}
	defer in.Close()
	lo, err := in.LinkByName("lo")
	if err != nil {
		t.Fatalf("test host: find lo: %v", err)
	}
	outer, err := root.LinkByName(h.Link)
	if err != nil {
		t.Fatalf("test host: find %s: %v", h.Link, err)
	}
	host := &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}
	na := &netlink.Addr{IPNet: host}
	via := h.Addr4
	if a.Is6() {
		na.Flags = unix.IFA_F_NODAD
		via = h.Addr6
	}
	if err := in.AddrAdd(lo, na); err != nil {
		t.Fatalf("test host: add %v: %v", a, err)
	}
	if err := root.RouteAdd(&netlink.Route{LinkIndex: outer.Attrs().Index, Dst: host, Gw: via.AsSlice()}); err != nil {
		t.Fatalf("test host: route %v via %v: %v", a, via, err)
	}
	if err := h.Netns.Do(func() error { return h.listenUDP(a) }); err != nil {
		t.Fatalf("test host: UDP servers on %v: %v", a, err)
	}
}

// serveTCP echoes on ln until the returned func closes it and every open
// connection.
func serveTCP(h *TestHost, ln net.Listener, wg *sync.WaitGroup) func() {
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	closed := false
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			if closed {
				mu.Unlock()
				c.Close()
				return
			}
			conns[c] = true
			mu.Unlock()
			h.hit("tcp", c.LocalAddr(), c.RemoteAddr())
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() {
					mu.Lock()
					delete(conns, c)
					mu.Unlock()
					c.Close()
				}()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					line := strings.TrimRight(sc.Text(), "\r")
					h.mu.Lock()
					h.lines = append(h.lines, Line{Local: addrPort(c.LocalAddr()), From: addrPort(c.RemoteAddr()), Text: line})
					h.mu.Unlock()
					if _, err := fmt.Fprintf(c, "%s from %v\n", line, addrPort(c.RemoteAddr())); err != nil {
						return
					}
				}
			}()
		}
	}()
	return func() {
		mu.Lock()
		closed = true
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		ln.Close()
	}
}

func serveUDP(h *TestHost, pc net.PacketConn) {
	buf := make([]byte, 64<<10)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		h.hit("udp", pc.LocalAddr(), from)
		msg := strings.TrimRight(string(buf[:n]), "\r\n")
		_ = pc.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = pc.WriteTo([]byte(fmt.Sprintf("%s from %v\n", msg, addrPort(from))), from)
	}
}
