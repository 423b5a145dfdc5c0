package ktest

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Capture records the IP packets one link of the test's netns carries,
// read with a packet socket bound to it. A packet socket sees a frame
// before netfilter does, so a packet in a capture of a sandbox's veth
// (host end) proves the guest sent it, whatever the firewall did next:
// a probe that "did not get through" is then known to have been tried.
type Capture struct {
	Link string

	mu   sync.Mutex
	pkts []Packet
	err  error
}

// Packet is the header of one captured IP packet.
type Packet struct {
	// In is true for a packet the link received (from its peer: for a
	// sandbox's host end, what the guest sent), false for one it sent.
	In    bool
	Proto string // "tcp", "udp", "icmp", "icmpv6" or the protocol number
	Src   netip.AddrPort
	Dst   netip.AddrPort
}

func (p Packet) String() string {
	dir := "out"
	if p.In {
		dir = "in"
	}
	return fmt.Sprintf("%s %s %v -> %v", dir, p.Proto, p.Src, p.Dst)
}

// NewCapture starts capturing on link (in the test's netns). Cleanup stops
// it and closes the socket.
func NewCapture(t testing.TB, link string) *Capture {
	t.Helper()
	ifi, err := net.InterfaceByName(link)
	if err != nil {
		t.Fatalf("capture: find link %s: %v", link, err)
	}
	proto := htons(unix.ETH_P_ALL)
	// SOCK_DGRAM: the kernel strips the link-layer header, so each read
	// starts at the IP header.
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, int(proto))
	if err != nil {
		t.Fatalf("capture on %s: packet socket: %v", link, err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: proto, Ifindex: ifi.Index}); err != nil {
		unix.Close(fd)
		t.Fatalf("capture on %s: bind: %v", link, err)
	}
	// A receive timeout lets the reader see the stop flag: closing a
	// socket does not wake a thread blocked reading it.
	tv := unix.NsecToTimeval((100 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		t.Fatalf("capture on %s: receive timeout: %v", link, err)
	}
	c := &Capture{Link: link}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 128) // headers only; the rest is truncated
		for {
			select {
			case <-stop:
				return
			default:
			}
			n, from, err := unix.Recvfrom(fd, buf, 0)
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil {
				c.mu.Lock()
				c.err = fmt.Errorf("capture on %s: read: %w", link, err)
				c.mu.Unlock()
				return
			}
			ll, _ := from.(*unix.SockaddrLinklayer)
			if ll == nil {
				continue
			}
			p, ok := parseIP(buf[:min(n, len(buf))])
			if !ok {
				continue
			}
			p.In = ll.Pkttype != unix.PACKET_OUTGOING
			c.mu.Lock()
			c.pkts = append(c.pkts, p)
			c.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		close(stop)
		<-done
		unix.Close(fd)
	})
	return c
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// parseIP reads the addresses, protocol and ports of an IPv4 or IPv6
// packet (no IPv6 extension headers: a port is left zero behind one).
func parseIP(b []byte) (Packet, bool) {
	var p Packet
	var proto byte
	var l4 []byte
	switch {
	case len(b) >= 20 && b[0]>>4 == 4:
		ihl := int(b[0]&0x0f) * 4
		src, _ := netip.AddrFromSlice(b[12:16])
		dst, _ := netip.AddrFromSlice(b[16:20])
		p.Src, p.Dst = netip.AddrPortFrom(src, 0), netip.AddrPortFrom(dst, 0)
		proto = b[9]
		// Only the first fragment carries the ports.
		if b[6]&0x1f == 0 && b[7] == 0 && len(b) >= ihl {
			l4 = b[ihl:]
		}
	case len(b) >= 40 && b[0]>>4 == 6:
		src, _ := netip.AddrFromSlice(b[8:24])
		dst, _ := netip.AddrFromSlice(b[24:40])
		p.Src, p.Dst = netip.AddrPortFrom(src, 0), netip.AddrPortFrom(dst, 0)
		proto = b[6]
		l4 = b[40:]
	default:
		return p, false
	}
	switch proto {
	case unix.IPPROTO_TCP:
		p.Proto = "tcp"
	case unix.IPPROTO_UDP:
		p.Proto = "udp"
	case unix.IPPROTO_ICMP:
		p.Proto = "icmp"
	case unix.IPPROTO_ICMPV6:
		p.Proto = "icmpv6"
	default:
		p.Proto = fmt.Sprint(proto)
	}
	if (p.Proto == "tcp" || p.Proto == "udp") && len(l4) >= 4 {
		p.Src = netip.AddrPortFrom(p.Src.Addr(), uint16(l4[0])<<8|uint16(l4[1]))
		p.Dst = netip.AddrPortFrom(p.Dst.Addr(), uint16(l4[2])<<8|uint16(l4[3]))
	}
	return p, true
}

// Packets returns what was captured so far, oldest first.
func (c *Capture) Packets() []Packet {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Packet(nil), c.pkts...)
}

// Err is the error that stopped the capture, if any.
func (c *Capture) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}
