package node

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/netpolicy"
	"github.com/ctld/ctld/internal/node/network"
)

// TestKernelWarmCarrier: on the real kernel a node with a warm carrier
// pool makes a carrier (netns + veth) after its takeover; a restricted
// claim takes it, its runsc guest reaches what the policy allows through
// the carrier's veth and nothing else; the pool is refilled on another
// slot; the release removes the taken carrier with the generation (clean
// proof); a primary with no pool destroys the warm one, and nothing is
// left (ktest.CheckLeaks).
func TestKernelWarmCarrier(t *testing.T) {
	ktest.Require(t)
	k := realKernel(t)
	k.carriers = 1
	host := ktest.NewTestHost(t, ktest.TestHostOptions{})
	r := newRig(t, k)
	r.mustBoot()
	waitCarriers(t, r, 1)
	links, err := k.links.List(t.Context())
	if err != nil || !slices.Contains(links, netpolicy.LinkName(1)) {
		t.Fatalf("links %v (%v), want the carrier's %s", links, err, netpolicy.LinkName(1))
	}
	allowed := netip.AddrPortFrom(host.Addr4, host.TCP[0])
	other := netip.AddrPortFrom(host.Other4, host.TCP[0])
	req := claimReq("c1", 1)
	req.Network = journal.NetworkPolicy{Mode: "restricted", Rules: []journal.NetworkRule{{CIDR: host.Addr4.String() + "/32", Protocol: "tcp", Ports: []string{fmt.Sprint(host.TCP[0])}}}}
	resp := r.mustClaim(sb, req)
	if s := r.sandbox(sb); s.Slot != 1 || s.Netns != network.CarrierNetns(1) {
		t.Fatalf("claim got slot %d netns %q, want carrier 1's", s.Slot, s.Netns)
	}
	t.Logf("claim with a warm carrier: network step %.1f ms, total %.1f ms", resp.Sandbox.Timings.NetworkMS, resp.Sandbox.Timings.TotalMS)
	if out, ok := guestDial(t, r, allowed); !ok {
		t.Fatalf("dial of the allowed %v through the carrier answered %q", allowed, out)
	}
	if out, ok := guestDial(t, r, other); ok {
		t.Fatalf("dial of %v (not allowed) answered %q", other, out)
	}
	waitCarriers(t, r, 2)
	r.mustRelease(sb, "r1", 1)
	r.checkProof("r1")
	netns, err := k.netns.List(t.Context())
	if err != nil || slices.Contains(netns, network.CarrierNetns(1)) || !slices.Contains(netns, network.CarrierNetns(2)) {
		t.Fatalf("netns after the release %v (%v): want carrier 2's and not the taken carrier 1's", netns, err)
	}
	k.carriers = 0
	r.mustBoot()
	waitCarriers(t, r)
	r.checkClean("after the release and a primary without carriers")
	checkUnjournaled(r, crashCase{})
}

// TestKernelWarmCarrierClaimTime measures, on the real kernel, a claim's
// network step (the netns, links, conntrack, nft and dns entries' make
// times) without and with a warm carrier, three claims each, and logs
// the medians and their ratio; every claim with the pool must have taken
// a carrier (its netns and veth made before it).
func TestKernelWarmCarrierClaimTime(t *testing.T) {
	ktest.Require(t)
	k := realKernel(t)
	k.showLog = false
	r := newRig(t, k)
	netSteps := map[string]bool{"netns": true, "links": true, "conntrack": true, "nft": true, "dns": true}
	median := map[int]float64{}
	gen := uint64(0)
	for _, size := range []int{0, 1} {
		k.carriers = size
		r.mustBoot()
		var ms []float64
		for i := 0; i < 3; i++ {
			gen++
			if size > 0 {
				waitCarriers(t, r, 1+uint32(i)%2)
			}
			resp := r.mustClaim(sb, claimReq(fmt.Sprintf("c%d", gen), gen))
			if took := network.TookCarrier(r.sandbox(sb)); took != (size > 0) {
				t.Fatalf("pool %d: claim %d took a carrier: %v", size, gen, took)
			}
			var sum float64
			for _, s := range resp.Sandbox.Timings.Steps {
				if netSteps[s.Resource] {
					sum += s.MakeMS
				}
			}
			ms = append(ms, sum)
			if size > 0 {
				waitCarriers(t, r, 1+uint32(i+1)%2)
			}
			r.mustRelease(sb, fmt.Sprintf("r%d", gen), gen)
		}
		slices.Sort(ms)
		median[size] = ms[1]
		t.Logf("warm carriers %d: claim network step %v ms (median %.2f)", size, ms, ms[1])
	}
	t.Logf("claim network step median: without a warm carrier %.2f ms, with one %.2f ms, ratio with/without %.2f", median[0], median[1], median[1]/median[0])
	k.carriers = 0
	r.mustBoot()
	r.checkClean("after the measurements")
	checkUnjournaled(r, crashCase{})
}
