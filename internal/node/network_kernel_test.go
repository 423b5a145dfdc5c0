package node

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/ktest"
)

// guestDial runs busybox nc in the guest to dst and reports whether the
// test host echoed the line back (its answer names the source address).
func guestDial(t *testing.T, r *rig, dst netip.AddrPort) (string, bool) {
	t.Helper()
	var out, errb strings.Builder
	cmd := fmt.Sprintf("echo hello | timeout 5 nc -w 3 %s %d", dst.Addr(), dst.Port())
	code, err := r.n.Exec(context.Background(), sb, ExecRequest{Args: []string{"/bin/sh", "-c", cmd}}, &out, &errb)
	if err != nil {
		t.Fatalf("exec in the guest: %v", err)
	}
	return out.String(), code == 0 && strings.HasPrefix(out.String(), "hello from ")
}

// TestKernelNetworkPolicyAndUpdate: on the real kernel a restricted
// generation reaches only what its policy allows, from its own address;
// a live update switches it to deny_all and then to open without
// restarting the guest (an open connection to a destination that stays
// allowed is the guest's business; new ones follow the policy at once);
// its counters move; release leaves nothing (CheckLeaks).
func TestKernelNetworkPolicyAndUpdate(t *testing.T) {
	ktest.Require(t)
	k := realKernel(t)
	host := ktest.NewTestHost(t, ktest.TestHostOptions{})
	r := newRig(t, k)
	r.mustBoot()
	allowed := netip.AddrPortFrom(host.Addr4, host.TCP[0])
	other := netip.AddrPortFrom(host.Other4, host.TCP[0])
	req := claimReq("c1", 1)
	req.Network = journal.NetworkPolicy{Mode: "restricted", Rules: []journal.NetworkRule{{CIDR: host.Addr4.String() + "/32", Protocol: "tcp", Ports: []string{fmt.Sprint(host.TCP[0])}}}}
	resp := r.mustClaim(sb, req)
	t.Logf("claim steps (ms): %+v", resp.Sandbox.Timings.Steps)
	// The node masquerades the pool out of its links: the host sees
	// the node's address on its side.
	if out, ok := guestDial(t, r, allowed); !ok || !strings.Contains(out, host.Gateway4.String()+":") {
		t.Fatalf("restricted: dial of the allowed %v answered %q (ok %v), want an echo from the node's %v", allowed, out, ok, host.Gateway4)
	}
	if out, ok := guestDial(t, r, other); ok || len(host.Hits()) != 1 {
		t.Fatalf("restricted: dial of %v (not allowed) answered %q; hits %v", other, out, host.Hits())
	}
	got, err := r.n.Get(context.Background(), sb)
	if err != nil || got.Network == nil || got.Network.TxPackets == 0 || got.Network.DroppedPackets == 0 {
		t.Errorf("counters after one allowed and one dropped connection: %+v %v", got.Network, err)
	}

	if _, err := r.n.UpdateNetwork(context.Background(), sb, journal.NetworkPolicy{Mode: "deny_all"}); err != nil {
		t.Fatal(err)
	}
	if out, ok := guestDial(t, r, allowed); ok {
		t.Fatalf("deny_all after the update: dial of %v answered %q", allowed, out)
	}
	if _, err := r.n.UpdateNetwork(context.Background(), sb, journal.NetworkPolicy{Mode: "open"}); err != nil {
		t.Fatal(err)
	}
	if out, ok := guestDial(t, r, other); !ok {
		t.Fatalf("open after the update: dial of %v answered %q", other, out)
	}
	if s := r.sandbox(sb); s.State != journal.StateReady || s.ContainerID != resp.Sandbox.ContainerID {
		t.Fatalf("after the updates: %s %s, want the same ready guest", s.State, s.ContainerID)
	}
	r.mustRelease(sb, "r1", 1)
	r.checkProof("r1")
	r.checkClean("after the release")
	checkUnjournaled(r, crashCase{})
}
