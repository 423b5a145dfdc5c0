package node

import (
	"slices"
	"testing"
)

// TestReleaseKillsGuestThroughLease: a release ends the guest with its
// lease's cgroup.kill before it deletes the container, and never runs
// `runsc kill` (a runsc start, and the sandbox then exits on its own,
// which runsc delete waits for); the proof is clean.
func TestReleaseKillsGuestThroughLease(t *testing.T) {
	tk, k := fakeKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	cid := r.mustClaim(sb, claimReq("c1", 1)).Sandbox.ContainerID
	k.Calls()
	r.mustRelease(sb, "r1", 1)
	calls := k.Calls()
	kill, del := slices.Index(calls, "lease kill "+cid), slices.Index(calls, "runsc delete "+cid)
	if kill < 0 || del < 0 || kill > del || slices.Contains(calls, "runsc kill "+cid) {
		t.Fatalf("release calls %q: want lease kill %s, then runsc delete, and no runsc kill", calls, cid)
	}
	r.checkProof("r1")
	r.checkClean("after the release")
}
