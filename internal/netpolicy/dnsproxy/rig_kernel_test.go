package dnsproxy

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

	"github.com/google/nftables"

	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/netpolicy"
	"github.com/ctld/ctld/internal/netpolicy/nft"
)

// sandboxRig is one sandbox behind the real firewall and a serving proxy:
// a netns with real Links, the firewall's table with the sandbox's policy
// applied, and the proxy registered for it. The test's cleanup undoes it
// all.
type sandboxRig struct {
	table string
	fw    *nft.Firewall
	o     netpolicy.Owner
	b     netpolicy.Block
	eff   netpolicy.Effective
	ns    ktest.Netns
	proxy *Proxy
}

type rigConfig struct {
	// table is the test's own, so other packages' tests in the VM (the
	// nft package uses the default table) never meet it.
	table   string
	port    uint16
	pool    netpolicy.Pool
	setSize uint32 // the firewall's DomainSetSize (0: its default)
	slot    netpolicy.Slot
	id      string
	rules   []netpolicy.RuleSpec
	// proxy sets the proxy's limits; newSandboxRig fills in Listen,
	// Pool, Upstreams, Allower and Logger.
	proxy Config
}

func newSandboxRig(t *testing.T, ctx context.Context, log *slog.Logger, upstream string, c rigConfig) *sandboxRig {
	t.Helper()
	r := &sandboxRig{table: c.table}
	var err error
	r.fw, err = nft.New(nft.Config{Table: c.table, DNSPort: c.port, Pool: c.pool, DomainSetSize: c.setSize}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ktest.DeleteNftTable(c.table); err != nil {
			t.Errorf("delete table: %v", err)
		}
	})
	if err := r.fw.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if r.b, err = c.pool.Block(c.slot); err != nil {
		t.Fatal(err)
	}
	r.o = netpolicy.Owner{ID: c.id, Generation: 1, Block: r.b}
	r.ns = ktest.NewNetns(t)
	links := &netpolicy.Links{Logger: log}
	if err := links.Make(ctx, r.o, r.ns.Path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := links.Remove(ctx, r.o.Link()); err != nil {
			t.Errorf("remove links: %v", err)
		}
	})
	p, err := netpolicy.ParseDefault("network", netpolicy.Spec{Mode: "restricted", Rules: c.rules})
	if err != nil {
		t.Fatal(err)
	}
	r.eff = netpolicy.Resolve(p, netpolicy.Facts{Pool: c.pool, Block: r.b})
	if err := r.fw.Apply(ctx, r.o, r.eff); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.fw.Remove(ctx, r.o); err != nil {
			t.Errorf("firewall remove: %v", err)
		}
	})
	pc := c.proxy
	pc.Listen, pc.Pool, pc.Upstreams, pc.Allower, pc.Logger = fmt.Sprintf(":%d", c.port), c.pool, []string{upstream}, r.fw, log
	if r.proxy, err = New(pc); err != nil {
		t.Fatal(err)
	}
	if err := r.proxy.Listen(); err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.proxy.Serve(sctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	r.proxy.Register(r.o, r.eff)
	t.Cleanup(func() { r.proxy.Unregister(r.b.Slot) })
	return r
}

// domainSet reads the sandbox's domain set of one family back.
func (r *sandboxRig) domainSet(t *testing.T, v6 bool) []nftables.SetElement {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	kt := nftables.TypeIPAddr
	if v6 {
		kt = nftables.TypeIP6Addr
	}
	els, err := c.GetSetElements(&nftables.Set{Table: &nftables.Table{Name: r.table, Family: nftables.TableFamilyINet}, Name: nft.DomainSetName(r.o, 0, v6), KeyType: kt})
	if err != nil {
		t.Fatal(err)
	}
	return els
}
