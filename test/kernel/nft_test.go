package kernel_test

import (
	"bytes"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/ktest"
	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

const nftTestTable = "ctldtest"

// TestNftDropPortInNetns proves nftables rules made through the library in a
// test netns take effect in that netns only for the port they name, and
// that deleting the table restores traffic.
func TestNftDropPortInNetns(t *testing.T) {
	ktest.Require(t)
	ktest.CheckLeaks(t, ktest.SnapshotOptions{})

	nsA, nsB := ktest.NewNetns(t), ktest.NewNetns(t)
	nftLogRuleset(t, nsB)
	ktest.VethPair(t, ktest.Veth{Netns: nsA.Handle, Name: "ctnft-a", Addr: "10.201.0.1/30"}, ktest.Veth{Netns: nsB.Handle, Name: "ctnft-b", Addr: "10.201.0.2/30"})

	l1 := nftListen(t, nsB, "10.201.0.2")
	l2 := nftListen(t, nsB, "10.201.0.2")
	addr1 := net.JoinHostPort("10.201.0.2", strconv.Itoa(int(l1.port)))
	addr2 := net.JoinHostPort("10.201.0.2", strconv.Itoa(int(l2.port)))

	// The first connection may race the veth carrier coming up; retry
	// briefly. Every later check is a single attempt.
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; {
		if err = nftDial(nsA, addr1, time.Second); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("before rules: dial %s from A: %v", addr1, err)
	}
	if err := nftDial(nsA, addr2, time.Second); err != nil {
		t.Fatalf("before rules: dial %s from A: %v", addr2, err)
	}

	c, err := nftables.New(nftables.WithNetNSFd(int(nsB.Handle)))
	if err != nil {
		t.Fatalf("nftables conn in netns B: %v", err)
	}
	tb, ch := nftQueueDropPort(c, nftTestTable, l1.port)
	if err := c.Flush(); err != nil {
		t.Fatalf("flush drop rule: %v", err)
	}
	deleted := false
	t.Cleanup(func() {
		if deleted {
			return
		}
		c.DelTable(tb)
		if err := c.Flush(); err != nil {
			t.Errorf("delete table %s: %v", nftTestTable, err)
		}
	})

	rules, err := c.GetRules(tb, ch)
	if err != nil {
		t.Fatalf("list rules of %s/%s: %v", nftTestTable, ch.Name, err)
	}
	if len(rules) != 1 {
		t.Fatalf("%s/%s has %d rules, want 1", nftTestTable, ch.Name, len(rules))
	}

	if err := nftDial(nsA, addr1, time.Second); err == nil {
		t.Fatalf("with drop rule: dial %s (dropped port) from A succeeded", addr1)
	} else if !nftIsTimeout(err) {
		t.Fatalf("with drop rule: dial %s: %v, want a timeout (drop, not reject)", addr1, err)
	}
	if err := nftDial(nsA, addr2, time.Second); err != nil {
		t.Fatalf("with drop rule: dial %s (other port) from A: %v", addr2, err)
	}

	// The rule lives in B only: the root netns has no such table.
	root, err := nftables.New()
	if err != nil {
		t.Fatalf("nftables conn in root netns: %v", err)
	}
	if nftHasTable(t, root, nftTestTable) {
		t.Fatalf("table inet %s visible in the root netns", nftTestTable)
	}

	c.DelTable(tb)
	if err := c.Flush(); err != nil {
		t.Fatalf("delete table %s: %v", nftTestTable, err)
	}
	deleted = true
	if nftHasTable(t, c, nftTestTable) {
		t.Fatalf("table inet %s still listed in netns B after delete", nftTestTable)
	}
	if err := nftDial(nsA, addr1, time.Second); err != nil {
		t.Fatalf("after table delete: dial %s from A: %v", addr1, err)
	}
}

func nftHasTable(t *testing.T, c *nftables.Conn, name string) bool {
	t.Helper()
	ts, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatalf("list inet tables: %v", err)
	}
	for _, tb := range ts {
		if tb.Name == name {
			return true
		}
	}
	return false
}

// TestNftQueueDropPortOneTransaction checks, without a kernel, that the
// table, chain and rule go out as one batch on one Flush and that the rule
// matches the port in network byte order and drops.
func TestNftQueueDropPortOneTransaction(t *testing.T) {
	var sends [][]netlink.Message
	c, err := nftables.New(nftables.WithTestDial(func(req []netlink.Message) ([]netlink.Message, error) {
		sends = append(sends, req)
		var acks []netlink.Message
		for _, m := range req {
			if m.Header.Flags&netlink.Acknowledge != 0 {
				acks = append(acks, netlink.Message{
					Header: netlink.Header{Length: 4, Type: netlink.Error, Sequence: m.Header.Sequence, PID: m.Header.PID},
					Data:   []byte{0, 0, 0, 0},
				})
			}
		}
		return acks, nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	nftQueueDropPort(c, nftTestTable, 8080)
	if len(sends) != 0 {
		t.Fatalf("queueing sent %d requests before Flush", len(sends))
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	// nltest hands the batch over one message per call; together they must
	// be one batch: begin, new table, new chain, new rule, end.
	var msgs []netlink.Message
	for _, s := range sends {
		msgs = append(msgs, s...)
	}
	if len(msgs) != 5 {
		t.Fatalf("flush sent %d messages, want 5", len(msgs))
	}
	if msgs[0].Header.Type != unix.NFNL_MSG_BATCH_BEGIN || msgs[4].Header.Type != unix.NFNL_MSG_BATCH_END {
		t.Fatalf("messages are not wrapped in one batch: first type %#x, last %#x", msgs[0].Header.Type, msgs[4].Header.Type)
	}
	wantTypes := []int{unix.NFT_MSG_NEWTABLE, unix.NFT_MSG_NEWCHAIN, unix.NFT_MSG_NEWRULE}
	for i, w := range wantTypes {
		if got := int(msgs[i+1].Header.Type) & 0xff; got != w {
			t.Errorf("message %d: nft type %d, want %d", i+1, got, w)
		}
	}
	rule := msgs[3].Data
	if !bytes.Contains(rule, []byte(nftTestTable+"\x00")) || !bytes.Contains(rule, []byte("input\x00")) {
		t.Errorf("rule message does not name table %s chain input", nftTestTable)
	}
	if !bytes.Contains(rule, binaryutil.BigEndian.PutUint16(8080)) {
		t.Errorf("rule message lacks port 8080 in network byte order")
	}
	exprs := nftDropPortExprs(8080)
	if v, ok := exprs[len(exprs)-1].(*expr.Verdict); !ok || v.Kind != expr.VerdictDrop {
		t.Errorf("last expression = %#v, want drop verdict", exprs[len(exprs)-1])
	}
}
