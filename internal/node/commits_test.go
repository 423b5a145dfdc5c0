package node

import "testing"

// Commits per overlay claim before the one-transaction runner (main at
// f05cc65, measured by this test): admit 1, 13 entries × (intended, done),
// the identities 1, readiness 1.
const claimCommitsBefore = 29

// TestClaimCommits counts the bbolt commits of one overlay claim (no
// volumes) and of its release on the fake kernel: each is an fsync, the
// claim's journaling cost. The one-transaction runner (makeEntries) must
// keep a claim at half the commits of before or fewer: admit with the
// first intended 1, 11 × (done, next intended), the last done 1 (with the
// identities folded into the netns entry's), readiness 1 = 14.
func TestClaimCommits(t *testing.T) {
	tk, _ := fakeKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	c0 := r.j.Commits()
	r.mustClaim(sb, claimReq("c1", 1))
	claim := r.j.Commits() - c0
	r0 := r.j.Commits()
	r.mustRelease(sb, "r1", 1)
	release := r.j.Commits() - r0
	t.Logf("bbolt commits: overlay claim %d (before the one-transaction runner: %d), release %d", claim, claimCommitsBefore, release)
	if claim == 0 || release == 0 {
		t.Fatalf("no commits counted: claim %d, release %d", claim, release)
	}
	if claim > claimCommitsBefore/2 {
		t.Fatalf("an overlay claim took %d commits, want at most %d (half of %d)", claim, claimCommitsBefore/2, claimCommitsBefore)
	}
}
