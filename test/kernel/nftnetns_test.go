package kernel_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// nftInNetns runs fn on a fresh OS thread switched into ns. The thread goes
// back to its original netns afterwards; if that fails it stays locked, so
// the runtime discards it instead of reusing a thread in the wrong netns.
func nftInNetns(ns netns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("get current netns: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			errc <- fmt.Errorf("enter netns: %w", err)
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

// nftNewNetns creates the named netns /run/netns/name. Cleanup closes the
// handle and removes the name; the netns goes when its last user is gone.
func nftNewNetns(t *testing.T, name string) netns.NsHandle {
	t.Helper()
	type res struct {
		h   netns.NsHandle
		err error
	}
	c := make(chan res, 1)
	go func() {
		// NewNamed leaves this thread in the new netns: keep it locked so
		// the runtime discards the thread when the goroutine ends.
		runtime.LockOSThread()
		h, err := netns.NewNamed(name)
		c <- res{h, err}
	}()
	r := <-c
	if r.err != nil {
		t.Fatalf("create netns %s: %v", name, r.err)
	}
	t.Cleanup(func() {
		_ = r.h.Close()
		if err := netns.DeleteNamed(name); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
			t.Errorf("delete netns %s: %v", name, err)
		}
	})
	return r.h
}

// nftVethPair links netns a and b with a veth pair, addresses both ends
// (CIDR strings) and brings them and lo up. Cleanup deletes the pair.
func nftVethPair(t *testing.T, a, b netns.NsHandle, nameA, nameB, addrA, addrB string) {
	t.Helper()
	ha, err := netlink.NewHandleAt(a)
	if err != nil {
		t.Fatalf("netlink handle in netns A: %v", err)
	}
	t.Cleanup(ha.Close)
	hb, err := netlink.NewHandleAt(b)
	if err != nil {
		t.Fatalf("netlink handle in netns B: %v", err)
	}
	t.Cleanup(hb.Close)

	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: nameA},
		PeerName:      nameB,
		PeerNamespace: netlink.NsFd(int(b)),
	}
	if err := ha.LinkAdd(veth); err != nil {
		t.Fatalf("add veth %s/%s: %v", nameA, nameB, err)
	}
	t.Cleanup(func() {
		// Deleting one end removes both; "not found" means already gone.
		l, err := ha.LinkByName(nameA)
		if err != nil {
			var nf netlink.LinkNotFoundError
			if !errors.As(err, &nf) {
				t.Errorf("find veth %s: %v", nameA, err)
			}
			return
		}
		if err := ha.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
			t.Errorf("delete veth %s: %v", nameA, err)
		}
	})
	for _, e := range []struct {
		h          *netlink.Handle
		link, cidr string
	}{{ha, nameA, addrA}, {hb, nameB, addrB}} {
		l, err := e.h.LinkByName(e.link)
		if err != nil {
			t.Fatalf("find %s: %v", e.link, err)
		}
		addr, err := netlink.ParseAddr(e.cidr)
		if err != nil {
			t.Fatalf("parse %s: %v", e.cidr, err)
		}
		if err := e.h.AddrAdd(l, addr); err != nil {
			t.Fatalf("add %s to %s: %v", e.cidr, e.link, err)
		}
		if err := e.h.LinkSetUp(l); err != nil {
			t.Fatalf("set %s up: %v", e.link, err)
		}
		lo, err := e.h.LinkByName("lo")
		if err != nil {
			t.Fatalf("find lo: %v", err)
		}
		if err := e.h.LinkSetUp(lo); err != nil {
			t.Fatalf("set lo up: %v", err)
		}
	}
}

// nftListener is a TCP listener opened inside a netns that answers every
// connection with "ok".
type nftListener struct {
	ln   net.Listener
	port uint16
	wg   sync.WaitGroup
}

func nftListen(t *testing.T, ns netns.NsHandle, ip string) *nftListener {
	t.Helper()
	l := &nftListener{}
	// The socket keeps the netns it was created in, so only Listen needs
	// the thread switch; Accept runs on any thread.
	if err := nftInNetns(ns, func() error {
		var err error
		l.ln, err = net.Listen("tcp4", net.JoinHostPort(ip, "0"))
		return err
	}); err != nil {
		t.Fatalf("listen on %s in netns: %v", ip, err)
	}
	l.port = uint16(l.ln.Addr().(*net.TCPAddr).Port)
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for {
			c, err := l.ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("ok"))
			_ = c.Close()
		}
	}()
	t.Cleanup(func() {
		_ = l.ln.Close()
		l.wg.Wait()
	})
	return l
}

// nftDial connects from inside ns to addr and reads the listener's "ok",
// giving up after timeout.
func nftDial(ns netns.NsHandle, addr string, timeout time.Duration) error {
	return nftInNetns(ns, func() error {
		d := net.Dialer{Timeout: timeout}
		c, err := d.Dial("tcp4", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		if err := c.SetReadDeadline(time.Now().Add(timeout)); err != nil {
			return err
		}
		b, err := io.ReadAll(c)
		if err != nil {
			return err
		}
		if string(b) != "ok" {
			return fmt.Errorf("read %q from %s, want \"ok\"", b, addr)
		}
		return nil
	})
}

// nftDropPortExprs is the rule body of "meta l4proto tcp tcp dport <port> drop".
func nftDropPortExprs(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		// Destination port: bytes 2-3 of the TCP header.
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}
}

// nftQueueDropPort queues table "inet <table>", a filter base chain "input"
// on the input hook (policy accept) and one rule dropping TCP to port; the
// caller's single Flush makes it one kernel transaction.
func nftQueueDropPort(c *nftables.Conn, table string, port uint16) (*nftables.Table, *nftables.Chain) {
	tb := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: table})
	accept := nftables.ChainPolicyAccept
	ch := c.AddChain(&nftables.Chain{
		Name:     "input",
		Table:    tb,
		Type:     nftables.ChainTypeFilter,
		Hooknum:  nftables.ChainHookInput,
		Priority: nftables.ChainPriorityFilter,
		Policy:   &accept,
	})
	c.AddRule(&nftables.Rule{Table: tb, Chain: ch, Exprs: nftDropPortExprs(port)})
	return tb, ch
}

// nftLogRuleset prints `nft list ruleset` of the named netns when the test
// failed; diagnosis only, the assertions use the library.
func nftLogRuleset(t *testing.T, nsName string) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		out, err := exec.Command("ip", "netns", "exec", nsName, "nft", "list", "ruleset").CombinedOutput()
		t.Logf("nft list ruleset in %s (err %v):\n%s", nsName, err, out)
	})
}

// nftIsTimeout reports whether err is a dial/read timeout, which is what a
// dropped SYN looks like (a reject would be "connection refused").
func nftIsTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded)
}
