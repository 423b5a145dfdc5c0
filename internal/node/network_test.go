package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/netpolicy"
	"github.com/ctld/ctld/internal/node/fakekernel"
	"github.com/ctld/ctld/internal/runsc"
)

// TestClaimMakesNetwork: a deny_all claim gets an address slot, a veth
// into its netns, its nft chain and dispatch element and a DNS proxy
// entry; its release removes them all, each with its proof check.
func TestClaimMakesNetwork(t *testing.T) {
	tk, k := fakeKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	if !k.TableEnsured() || !k.Forwarding() {
		t.Fatalf("after the takeover: table ensured %v, forwarding %v; want both", k.TableEnsured(), k.Forwarding())
	}
	r.mustClaim(sb, claimReq("c1", 1))
	if s := r.sandbox(sb); s.Slot != 1 {
		t.Fatalf("slot %d, want 1", s.Slot)
	}
	want := []string{
		"dns slot 1 sb-g1 mode deny_all",
		"link ctl-00001 alias sb-g1 peer eth0 in net:[4026532101] gateway 10.200.0.2 sandbox 10.200.0.3",
		"nft chain sb-sb-g1 mode deny_all allow4 0 allow6 0 domains 0",
		"nft dispatch ctl-00001 goto sb-sb-g1",
	}
	text := k.String()
	for _, w := range want {
		if !strings.Contains(text, w+"\n") {
			t.Errorf("kernel after the claim lacks %q:\n%s", w, text)
		}
	}
	eff, _ := k.Effective("sb-sb-g1")
	if eff.Source4 != netip.MustParseAddr("10.200.0.3") || eff.Source6 != netip.MustParseAddr("fd00:c71d::6") || len(eff.Allow4)+len(eff.Allow6) != 0 {
		t.Errorf("deny_all chain enforces %+v", eff)
	}
	rel := r.mustRelease(sb, "r1", 1)
	var got []string
	for _, c := range rel.Proof.Checks {
		got = append(got, c.Name)
		if !c.OK {
			t.Errorf("check %s failed: %s", c.Name, c.Detail)
		}
	}
	for _, name := range []string{"veth_gone_address_free", "nft_gone", "conntrack_gone", "dns_state_gone"} {
		if !slices.Contains(got, name) {
			t.Errorf("proof checks %v lack %s", got, name)
		}
	}
	r.checkClean("after the release")
}

// TestTeardownOrderOfNetwork: a release kills the guest, then removes
// the DNS entry, the nft objects (before the link they dispatch on), the
// flows (once nothing marks new ones), the link, then the netns.
func TestTeardownOrderOfNetwork(t *testing.T) {
	tk, k := fakeKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	r.mustClaim(sb, claimReq("c1", 1))
	k.AddFlow(1, fakekernel.Flow{Proto: netpolicy.ProtoTCP, Dst: netip.MustParseAddrPort("203.0.113.7:443")})
	k.Calls()
	r.mustRelease(sb, "r1", 1)
	calls := k.Calls()
	order := []string{"lease kill sb-g1", "runsc delete sb-g1", "nft remove sb-sb-g1", "conntrack flush 1", "link remove ctl-00001", "netns delete sb-g1"}
	last := -1
	for _, c := range order {
		i := slices.Index(calls, c)
		if i < 0 || i < last {
			t.Fatalf("release calls %q: want in order %q", calls, order)
		}
		last = i
	}
	r.checkProof("r1")
	r.checkClean("after the release")
}

// TestSlotAllocation: slots are handed out lowest first; a full pool
// refuses a claim with capacity_exhausted before anything is journaled or
// made; a released generation's slot is reused.
func TestSlotAllocation(t *testing.T) {
	tk, k := fakeKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	n := int(testPool.Len()) // 7: a /28 of /31 blocks less slot 0
	for i := 1; i <= n; i++ {
		id := fmt.Sprintf("s%d", i)
		r.mustClaim(id, claimReq("c"+id, 1))
		if s := r.sandbox(id); s.Slot != uint32(i) {
			t.Fatalf("sandbox %s got slot %d, want %d", id, s.Slot, i)
		}
	}
	if nd, _ := r.n.Node(context.Background()); nd.Capacity.Total.Addresses != int64(n) || nd.Capacity.Leased.Addresses != int64(n) {
		t.Errorf("address ledger with the pool full: total %d leased %d, want %d and %d", nd.Capacity.Total.Addresses, nd.Capacity.Leased.Addresses, n, n)
	}
	before := k.String()
	_, err, _ := r.claim("full", claimReq("cfull", 1))
	if errdefs.CodeOf(err) != errdefs.CodeCapacityExhausted || !strings.Contains(err.Error(), "address block") {
		t.Fatalf("claim with the pool full: %v, want capacity_exhausted naming the address pool", err)
	}
	if _, err := r.n.sandbox("full"); errdefs.CodeOf(err) != errdefs.CodeNotFound {
		t.Errorf("the refused claim left a record: %v", err)
	}
	if after := k.String(); after != before {
		t.Errorf("the refused claim changed the kernel:\n%s\nwas:\n%s", after, before)
	}
	r.mustRelease("s3", "r3", 1)
	r.mustClaim("again", claimReq("cagain", 1))
	if s := r.sandbox("again"); s.Slot != 3 {
		t.Errorf("after releasing slot 3 a claim got slot %d, want 3", s.Slot)
	}
}

// TestSlotReusedOnlyAfterCleanProof: a generation whose veth cannot be
// removed is withheld and keeps its slot (the next claim gets another);
// once its cleanup is proven the slot is free again.
func TestSlotReusedOnlyAfterCleanProof(t *testing.T) {
	tk, k := fakeKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	r.mustClaim("a", claimReq("ca", 1))
	k.Refuse(journal.KindLinks, "a-g1", nil)
	rel, err, _ := r.release("a", "ra", 1)
	if err != nil || rel.Proof.Clean {
		t.Fatalf("release with the link refusing removal: clean=%v, %v", rel.Proof.Clean, err)
	}
	if s := r.sandbox("a"); !s.Withheld || s.Slot != 1 {
		t.Fatalf("sandbox a: withheld %v slot %d, want withheld holding slot 1", s.Withheld, s.Slot)
	}
	if nd, _ := r.n.Node(context.Background()); nd.Capacity.Withheld.Addresses != 1 || len(nd.Withheld) != 1 || nd.Withheld[0].Resources.Addresses != 1 {
		t.Errorf("withheld ledger: %+v %+v, want the address block withheld", nd.Capacity.Withheld, nd.Withheld)
	}
	r.mustClaim("b", claimReq("cb", 1))
	if s := r.sandbox("b"); s.Slot != 2 {
		t.Fatalf("claim beside a withheld slot 1 got slot %d, want 2", s.Slot)
	}
	k.Allow(journal.KindLinks, "a-g1")
	r.mustBoot() // the takeover retries the withheld teardown
	if s := r.sandbox("a"); s.Withheld {
		t.Fatalf("still withheld after the link could go: %s", s.Reason)
	}
	r.mustClaim("c", claimReq("cc", 1))
	if s := r.sandbox("c"); s.Slot != 1 {
		t.Fatalf("after the clean proof a claim got slot %d, want 1", s.Slot)
	}
}

// TestReconcileLostNetwork: a ready generation whose veth or nft chain
// vanished (an operator's `ip link del`, `nft flush ruleset`) is lost:
// the takeover tears it down with a clean proof.
func TestReconcileLostNetwork(t *testing.T) {
	for _, c := range []struct {
		name, what string
		drop       func(k *fakekernel.Kernel) error
	}{
		{"link", "veth", func(k *fakekernel.Kernel) error { return k.Links().Remove(context.Background(), "ctl-00001") }},
		{"table", "nft chain", func(k *fakekernel.Kernel) error { k.DropTable(); return nil }},
	} {
		t.Run(c.name, func(t *testing.T) {
			tk, k := fakeKernel(t)
			r := newRig(t, tk)
			r.mustBoot()
			resp := r.mustClaim(sb, claimReq("c1", 1))
			if err := c.drop(k); err != nil {
				t.Fatal(err)
			}
			r.mustBoot()
			s := r.sandbox(sb)
			if s.State != journal.StateReleased || !strings.Contains(s.Reason, c.what) {
				t.Fatalf("after takeover: %s (%s), want released as lost with %s gone", s.State, s.Reason, c.what)
			}
			r.checkProof("lost-" + resp.Sandbox.ContainerID)
			r.checkClean("after the lost generation")
			checkUnjournaled(r, crashCase{})
		})
	}
}

// TestDNSRegistryRebuiltOnTakeover: the DNS proxy's registry is memory:
// a new term registers every ready generation again, with its policy.
func TestDNSRegistryRebuiltOnTakeover(t *testing.T) {
	tk, k := fakeKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	req := claimReq("c1", 1)
	req.Network = journal.NetworkPolicy{Mode: "restricted", Rules: []journal.NetworkRule{{Domain: "example.com", Protocol: "tcp", Ports: []string{"443"}}}}
	r.mustClaim(sb, req)
	k.RestartDNSProxy()
	if _, ok := k.Registered(1); ok {
		t.Fatal("RestartDNSProxy kept the registry")
	}
	r.mustBoot()
	eff, ok := k.Registered(1)
	if !ok || eff.Mode != netpolicy.ModeRestricted || len(eff.Domains) != 1 || eff.Domains[0].Names[0] != "example.com" {
		t.Fatalf("after the takeover slot 1 registered %v: %+v", ok, eff)
	}
}

// TestNetworkModesFailClosed: a node without the network subsystems runs
// deny_all sandboxes (netns with lo only, no slot objects) and refuses
// open and restricted before anything is journaled; one without a DNS
// proxy refuses policies that resolve names. The entries of the parts it
// lacks are absent: its claims journal and make none of them.
func TestNetworkModesFailClosed(t *testing.T) {
	open := journal.NetworkPolicy{Mode: "open"}
	cidr := journal.NetworkPolicy{Mode: "restricted", Rules: []journal.NetworkRule{{CIDR: "203.0.113.0/24"}}}
	domain := journal.NetworkPolicy{Mode: "restricted", Rules: []journal.NetworkRule{{Domain: "example.com"}}}
	for _, c := range []struct {
		name   string
		strip  func(*testKernel)
		refuse []journal.NetworkPolicy
		allow  []journal.NetworkPolicy
		absent []journal.Kind
	}{
		{"no links", func(k *testKernel) { k.links = nil }, []journal.NetworkPolicy{open, cidr, domain}, nil, vethKinds},
		{"no firewall", func(k *testKernel) { k.firewall = nil }, []journal.NetworkPolicy{open, cidr, domain}, nil, vethKinds},
		{"no conntrack", func(k *testKernel) { k.flows = nil }, []journal.NetworkPolicy{open, cidr, domain}, nil, []journal.Kind{journal.KindConntrack}},
		{"no pool", func(k *testKernel) { k.pool = netpolicy.Pool{} }, []journal.NetworkPolicy{open, cidr, domain}, nil, vethKinds},
		{"no dns proxy", func(k *testKernel) { k.dns = nil }, []journal.NetworkPolicy{open, domain}, []journal.NetworkPolicy{cidr}, []journal.Kind{journal.KindDNS}},
		{"everything", func(*testKernel) {}, nil, []journal.NetworkPolicy{open, cidr, domain}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			tk, k := fakeKernel(t)
			c.strip(tk)
			r := newRig(t, tk)
			r.mustBoot()
			for i, p := range c.refuse {
				req := claimReq(fmt.Sprintf("refused%d", i), 1)
				req.Network = p
				_, err, _ := r.claim(sb, req)
				if errdefs.CodeOf(err) != errdefs.CodeUnavailable {
					t.Errorf("claim with %+v: %v, want unavailable", p, err)
				}
				if got := k.String(); got != "" {
					t.Fatalf("a refused claim left:\n%s", got)
				}
			}
			gen := uint64(1)
			for _, p := range append([]journal.NetworkPolicy{{}}, c.allow...) {
				req := claimReq(fmt.Sprintf("c%d", gen), gen)
				req.Network = p
				r.mustClaim(sb, req)
				effects := r.effects()
				for _, kind := range c.absent {
					if e, ok := effects[string(kind)+"/"+containerID(sb, gen)]; ok {
						t.Errorf("claim with %+v journaled %s (%s), which this node lacks", p, kind, e.State)
					}
				}
				if _, ok := effects["netns/"+containerID(sb, gen)]; !ok {
					t.Errorf("claim with %+v journaled no netns", p)
				}
				if p.Mode != "" {
					eff, ok := k.Effective(netpolicy.ChainName(sb, gen))
					if !ok || string(eff.Mode) != string(p.Mode) {
						t.Errorf("claim with %+v: chain %v enforces %s", p, ok, eff.Mode)
					}
				}
				r.mustRelease(sb, fmt.Sprintf("r%d", gen), gen)
				gen++
			}
			r.checkClean("after the claims")
		})
	}
}

// vethKinds are the entries a node without a veth (links, firewall and
// pool) lacks.
var vethKinds = []journal.Kind{journal.KindLinks, journal.KindNft, journal.KindDNS}

// TestFirewallNotReadyRefusesClaims: when the term cannot make the nft
// table, every claim that would need it is refused (fail closed).
func TestFirewallNotReadyRefusesClaims(t *testing.T) {
	tk, k := fakeKernel(t)
	k.FailMake(journal.KindNft, fakekernel.TableName, nil)
	r := newRig(t, tk)
	if returned, err := r.boot(); !returned || err == nil {
		t.Fatalf("takeover with the table failing: returned %v, err %v; want an error", returned, err)
	}
	req := claimReq("c1", 1)
	req.Network = journal.NetworkPolicy{Mode: "open"}
	for _, p := range []journal.NetworkPolicy{req.Network, {}} {
		req := req
		req.Network = p
		if _, err, _ := r.claim(sb, req); errdefs.CodeOf(err) != errdefs.CodeUnavailable || !strings.Contains(err.Error(), "not ready") {
			t.Fatalf("claim with %+v without the table: %v, want unavailable (not ready)", p, err)
		}
	}
	if got := k.String(); got != "" {
		t.Fatalf("refused claims left:\n%s", got)
	}
	k.ClearFailMake(journal.KindNft, fakekernel.TableName)
	r.mustBoot()
	r.mustClaim(sb, req)
}

// TestGuestResolvConf: with a DNS proxy every generation's bundle binds a
// generated resolv.conf over the guest's /etc/resolv.conf, naming its
// gateways (where port 53 goes to the proxy), deny_all included; the file
// is in the bundle dir, so the release removes it (bundle_removed).
// Without a proxy the bundle binds none.
func TestGuestResolvConf(t *testing.T) {
	tk, _ := fakeKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	r.mustClaim(sb, claimReq("c1", 1))
	b, err := testPool.Block(1)
	if err != nil {
		t.Fatal(err)
	}
	dir := r.n.bundleDir(containerID(sb, 1))
	want := fmt.Sprintf("nameserver %s\nnameserver %s\n", b.Gateway4, b.Gateway6)
	got, err := os.ReadFile(filepath.Join(dir, runsc.ResolvConfFile))
	if err != nil || !strings.HasSuffix(string(got), want) || strings.Count(string(got), "nameserver") != 2 {
		t.Errorf("resolv.conf of the bundle: %q, %v; want it to name %s", got, err, want)
	}
	if m, ok := resolvMount(t, dir); !ok || m.Source != filepath.Join(dir, runsc.ResolvConfFile) || !slices.Contains(m.Options, "ro") {
		t.Errorf("config.json mounts /etc/resolv.conf as %+v (found %v), want a read-only bind of the bundle's resolv.conf", m, ok)
	}
	r.mustRelease(sb, "r1", 1)
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("bundle dir after the release: %v", err)
	}
	r.checkProof("r1")
	r.checkClean("after the release")

	tk.dns = nil
	r.mustBoot()
	r.mustClaim("plain", claimReq("c2", 1))
	dir = r.n.bundleDir(containerID("plain", 1))
	if _, err := os.Stat(filepath.Join(dir, runsc.ResolvConfFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("without a DNS proxy the bundle has a resolv.conf: %v", err)
	}
	if m, ok := resolvMount(t, dir); ok {
		t.Errorf("without a DNS proxy config.json mounts /etc/resolv.conf: %+v", m)
	}
}

// resolvMount is the bundle's mount of /etc/resolv.conf, if any.
func resolvMount(t *testing.T, dir string) (specs.Mount, bool) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	for _, m := range s.Mounts {
		if m.Destination == "/etc/resolv.conf" {
			return m, true
		}
	}
	return specs.Mount{}, false
}
