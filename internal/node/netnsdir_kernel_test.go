package node

import (
	"os/exec"
	"testing"

	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/mountinfo"
	"github.com/ctld/ctld/internal/netpolicy"
	"golang.org/x/sys/unix"
)

// TestKernelIPNetnsAddAfterStart: an operator's `ip netns add` after
// ctld started on a fresh host (/run/netns no mount point yet) does not
// hide ctld's netns mounts: ctld made /run/netns a shared mount point of
// its own first (Netns.Prepare, as cmd/ctld does at start), so iproute2
// does not bind it over itself. The generation claimed before the `ip
// netns add` releases with a clean proof (netns_gone), and the next one
// claims and releases cleanly too.
func TestKernelIPNetnsAddAfterStart(t *testing.T) {
	ktest.Require(t)
	ktest.RequireBinary(t, "ip")
	k := realKernel(t)
	freshNetnsDir(t)
	ns := &netpolicy.Netns{Prefix: "ctldkt" + randHex(3) + "-"} // in /run/netns, where iproute2 works
	k.netns = ns
	if err := ns.Prepare(t.Context()); err != nil { // as cmd/ctld's buildNode
		t.Fatal(err)
	}
	if !netnsDirMounted(t) {
		t.Fatal("/run/netns is no mount point after Prepare")
	}
	r := newRig(t, k)
	r.mustBoot()
	r.mustClaim(sb, claimReq("c1", 1))

	// The operator's netns, after ctld's.
	opNS := "ctldkt-operator-" + randHex(3)
	if out, err := exec.Command("ip", "netns", "add", opNS).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", opNS).CombinedOutput(); err != nil {
			t.Errorf("ip netns del: %v\n%s", err, out)
		}
	})

	r.mustRelease(sb, "r1", 1)
	r.checkProof("r1")
	r.mustClaim(sb, claimReq("c2", 2))
	r.mustRelease(sb, "r2", 2)
	r.checkProof("r2")
	r.checkClean("after both releases")
}

// freshNetnsDir makes /run/netns what it is on a host where neither ctld
// nor iproute2 ran yet: no mount point (an earlier test of this VM boot
// may have made it one, which stays so by design).
func freshNetnsDir(t *testing.T) {
	t.Helper()
	if !netnsDirMounted(t) {
		return
	}
	ms, err := mountinfo.ReadFile(mountinfo.SelfPath)
	if err != nil {
		t.Fatal(err)
	}
	if below := mountinfo.Under(ms, "/run/netns"); len(below) > len(mountinfo.At(ms, "/run/netns")) {
		t.Fatalf("/run/netns holds mounts of others (%s): cannot make it a fresh host's", below[0].MountPoint)
	}
	for netnsDirMounted(t) {
		if err := unix.Unmount("/run/netns", 0); err != nil {
			t.Fatalf("unmount /run/netns: %v", err)
		}
	}
}

func netnsDirMounted(t *testing.T) bool {
	t.Helper()
	ms, err := mountinfo.ReadFile(mountinfo.SelfPath)
	if err != nil {
		t.Fatal(err)
	}
	return len(mountinfo.At(ms, "/run/netns")) > 0
}
