package kernel_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/ktest"
	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// nftListener is a TCP listener opened inside a netns that answers every
// connection with "ok".
type nftListener struct {
	ln   net.Listener
	port uint16
	wg   sync.WaitGroup
}

func nftListen(t *testing.T, ns ktest.Netns, ip string) *nftListener {
	t.Helper()
	l := &nftListener{}
	// The socket keeps the netns it was created in, so only Listen needs
	// the thread switch; Accept runs on any thread.
	if err := ns.Do(func() error {
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
func nftDial(ns ktest.Netns, addr string, timeout time.Duration) error {
	return ns.Do(func() error {
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

// nftLogRuleset prints `nft list ruleset` of ns when the test failed;
// diagnosis only, the assertions use the library.
func nftLogRuleset(t *testing.T, ns ktest.Netns) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		out, err := exec.Command("nsenter", "--net="+ns.Path, "nft", "list", "ruleset").CombinedOutput()
		t.Logf("nft list ruleset in %s (err %v):\n%s", ns.Path, err, out)
	})
}

// nftIsTimeout reports whether err is a dial/read timeout, which is what a
// dropped SYN looks like (a reject would be "connection refused").
func nftIsTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded)
}
