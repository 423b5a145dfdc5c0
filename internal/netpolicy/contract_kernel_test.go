package netpolicy_test

import (
	"log/slog"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/mdlayher/netlink"
	"github.com/ti-mo/conntrack"
	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/netpolicy"
	"github.com/ctld/ctld/internal/netpolicy/flows"
	"github.com/ctld/ctld/internal/netpolicy/nft"
	"github.com/ctld/ctld/internal/node/network/nettest"
)

// TestKernelNetworkContract: netpolicy's Netns (its dir a temp dir),
// Links, an nft.Firewall on a table of its own and flows.Conntrack (in a
// netns of the test, its flows made with ctnetlink) keep the network
// contract the fake kernel keeps on the host (node/fakekernel
// TestNetworkContract); each case on fresh ones, leak-checked.
func TestKernelNetworkContract(t *testing.T) {
	ktest.Require(t)
	pool := netpolicy.Pool{V4: netip.MustParsePrefix("10.237.0.0/24"), V6: netip.MustParsePrefix("fd00:c71d:4e8::/64")}
	nettest.Run(t, func(t *testing.T) nettest.Subject {
		ktest.CheckLeaks(t, ktest.SnapshotOptions{})
		log := slog.New(slog.NewTextHandler(t.Output(), nil))
		fw, err := nft.New(nft.Config{Table: ktest.NftTable(t, "ctld-ct-"), DNSPort: 10053, Pool: pool}, log)
		if err != nil {
			t.Fatal(err)
		}
		flowNS := ktest.NewNetns(t)
		c, err := conntrack.Dial(&netlink.Config{NetNS: int(flowNS.Handle)})
		if err != nil {
			t.Fatalf("dial conntrack (is nf_conntrack_netlink loaded?): %v", err)
		}
		t.Cleanup(func() { c.Close() })
		sport := uint16(41000)
		return nettest.Subject{
			Netns:    &netpolicy.Netns{Dir: filepath.Join(t.TempDir(), "netns"), Logger: log},
			Links:    &netpolicy.Links{Logger: log},
			Firewall: fw,
			Flows:    &flows.Conntrack{NetNS: int(flowNS.Handle), Logger: log},
			Pool:     pool,
			AddFlow: func(t *testing.T, slot netpolicy.Slot, proto netpolicy.Proto, dst netip.AddrPort) {
				blk, err := pool.Block(slot)
				if err != nil {
					t.Fatal(err)
				}
				mark, err := flows.Mark(flows.DefaultMask, slot)
				if err != nil {
					t.Fatal(err)
				}
				src := blk.Addr4
				if dst.Addr().Is6() {
					src = blk.Addr6
				}
				p := uint8(unix.IPPROTO_TCP)
				if proto == netpolicy.ProtoUDP {
					p = unix.IPPROTO_UDP
				}
				sport++
				if err := c.Create(conntrack.NewFlow(p, 0, src, dst.Addr(), sport, dst.Port(), 300, mark)); err != nil {
					t.Fatalf("create flow of slot %d to %s: %v", slot, dst, err)
				}
			},
		}
	})
}
