package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/fakekernel"
	"github.com/ctld/ctld/internal/node/warm"
)

// warmRig is a fake-kernel rig whose node keeps size warm members of
// template busybox, refilled every refill (0: 1 ms).
func warmRig(t *testing.T, size int, refill time.Duration) *rig {
	tk, _ := fakeKernel(t)
	tk.warm = warm.Settings{Sizes: map[string]int{"busybox": size}, RefillEvery: refill}
	return newRig(t, tk)
}

// waitMembers waits until the journal holds exactly want idle members and
// none booting or being removed, and returns them.
func waitMembers(t testing.TB, r *rig, want int) []journal.WarmMember {
	t.Helper()
	for deadline := time.Now().Add(r.k.timeout); ; {
		ms, err := r.n.warmMembers()
		if err != nil {
			t.Fatal(err)
		}
		idle := 0
		for _, m := range ms {
			if m.State == journal.WarmIdle {
				idle++
			}
		}
		if idle == want && len(ms) == want {
			return ms
		}
		if time.Now().After(deadline) {
			t.Fatalf("warm members %+v, want %d idle", ms, want)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// memberHeld is what one member holds in the ledger.
func memberHeld(r *rig) Capacity {
	res := r.n.warmResources()
	return Capacity{CPUMillis: res.CPUMillis, MemoryBytes: res.MemoryBytes, PIDs: res.PIDs + r.n.cfg.RuntimePIDs, DiskBytes: res.DiskBytes, Addresses: 1}
}

func (r *rig) ledger() Ledger {
	r.t.Helper()
	nd, err := r.n.Node(context.Background())
	if err != nil {
		r.t.Fatal(err)
	}
	return nd.Capacity
}

// TestWarmPoolHitSingleUseRefill: a claim of the pool's template takes
// the idle member (its record names the member's objects, its limits are
// the claim's, its workload runs through the agent's claim), the member
// is never handed out again, the pool refills with a new one; the ledger
// shows the member as warm, never also as leased; release gives a clean
// proof and leaves only the new member.
func TestWarmPoolHitSingleUseRefill(t *testing.T) {
	r := warmRig(t, 1, 0)
	r.mustBoot()
	m := waitMembers(t, r, 1)[0]
	if l := r.ledger(); l.Warm != memberHeld(r) || l.Leased != (Capacity{}) {
		t.Fatalf("ledger with one idle member: warm %+v leased %+v, want warm %+v and nothing leased", l.Warm, l.Leased, memberHeld(r))
	}
	if !strings.HasPrefix(m.Rec.ContainerID, warmIDPrefix) || m.Rec.Generation != 1 || !m.Rec.Warm {
		t.Fatalf("member record %+v", m.Rec)
	}
	ss, err := r.n.List(context.Background())
	if err != nil || len(ss) != 0 {
		t.Fatalf("sandbox list with an idle member: %d sandboxes (%v), want none", len(ss), err)
	}

	req := claimReq("c1", 1)
	req.Process.Env = []string{"CLAIM=1"}
	got := r.mustClaim("sb", req).Sandbox
	if got.WarmMember != m.Rec.ID || got.ContainerID != m.Rec.ContainerID || got.State != journal.StateReady {
		t.Fatalf("claim did not take member %s: %+v", m.Rec.ID, got)
	}
	// The lease took the claim's cpu.max last (the member booted at its own).
	if h := r.k.leases.(*fakekernel.Leases).CPUMaxHistory(got.LeaseID); len(h) < 2 || h[len(h)-1] != req.Resources.CPUMillis {
		t.Errorf("cpu.max history of the taken member's lease %v, want the claim's %dm last", h, req.Resources.CPUMillis)
	}
	// The member's effect records are the claim's now.
	for k, e := range r.effects() {
		if e.Name == m.Rec.ContainerID && (e.SandboxID != "sb" || e.Generation != 1) {
			t.Errorf("effect %s of the taken member still names %s/%d", k, e.SandboxID, e.Generation)
		}
	}
	ctx, cancel := r.ctx()
	defer cancel()
	var out bytes.Buffer
	if code, err := r.n.Exec(ctx, "sb", ExecRequest{Args: []string{"cat"}, Stdin: []byte("in")}, &out, &out); err != nil || code != 0 || out.String() != "in" {
		t.Fatalf("exec in the warm claim: %d %v %q", code, err, out.String())
	}

	// Refilled with a new member; the taken one is never one again.
	n := waitMembers(t, r, 1)[0]
	if n.Rec.ID == m.Rec.ID {
		t.Fatalf("the taken member %s is in the pool again", m.Rec.ID)
	}
	want := asCapacity(req.Resources)
	want.PIDs += r.n.cfg.RuntimePIDs
	want.Addresses = 1
	if l := r.ledger(); l.Leased != want || l.Warm != memberHeld(r) {
		t.Fatalf("ledger after the warm claim: leased %+v warm %+v, want leased %+v warm %+v", l.Leased, l.Warm, want, memberHeld(r))
	}
	st, err := r.n.WarmPools()
	if err != nil || st["busybox"].Hits != 1 || st["busybox"].Misses != 0 || st["busybox"].Idle != 1 {
		t.Fatalf("pool stats %+v %v, want 1 hit, 0 misses, 1 idle", st, err)
	}

	r.mustRelease("sb", "r1", 1)
	r.checkProof("r1")
	for _, e := range r.effects() {
		if e.SandboxID != n.Rec.ID {
			t.Errorf("effect record left after the release: %+v", e)
		}
	}
	if u := r.allUnjournaled(); len(u) > 0 {
		t.Errorf("unjournaled objects: %v", u)
	}
}

// TestWarmPoolMissGoesCold: with the pool drained (no refill within the
// test), a claim finds no member and is made cold; a claim the pool cannot
// serve (memory below a member's) goes cold without counting as a miss.
func TestWarmPoolMissGoesCold(t *testing.T) {
	r := warmRig(t, 1, time.Hour)
	r.mustBoot()
	m := waitMembers(t, r, 1)[0]
	small := claimReq("c0", 1)
	small.Resources.MemoryBytes = 64 << 20
	if got := r.mustClaim("small", small).Sandbox; got.WarmMember != "" || got.ContainerID != containerID("small", 1) {
		t.Fatalf("a claim below a member's memory took one: %+v", got)
	}
	if got := r.mustClaim("a", claimReq("c1", 1)).Sandbox; got.WarmMember != m.Rec.ID {
		t.Fatalf("first claim did not take the member: %+v", got)
	}
	got := r.mustClaim("b", claimReq("c2", 1)).Sandbox
	if got.WarmMember != "" || got.ContainerID != containerID("b", 1) || got.State != journal.StateReady {
		t.Fatalf("second claim with the pool drained: %+v, want a cold claim", got)
	}
	st, _ := r.n.WarmPools()
	if s := st["busybox"]; s.Hits != 1 || s.Misses != 1 || s.HitRate() != 0.5 {
		t.Fatalf("pool stats %+v, want 1 hit and 1 miss", s)
	}
	for _, id := range []string{"small", "a", "b"} {
		r.mustRelease(id, "r-"+id, 1)
		r.checkProof("r-" + id)
	}
	if l := r.ledger(); l.Leased != (Capacity{}) || l.Warm != (Capacity{}) {
		t.Fatalf("ledger after releases with the pool drained: %+v", l)
	}
	r.checkClean("after releases, pool drained")
}

// TestWarmPoolTakeoverDestroysMembers: a takeover destroys every member
// the journal has, idle or half booted, each with a clean signed cleanup
// proof, and leaves nothing in the kernel (the new term keeps no pool).
func TestWarmPoolTakeoverDestroysMembers(t *testing.T) {
	r := warmRig(t, 2, 0)
	r.mustBoot()
	ms := waitMembers(t, r, 2)
	r.k.warm = warm.Settings{}
	r.mustBoot()
	for _, m := range ms {
		p := r.checkProof("warm-destroy-" + m.Rec.ID)
		if p.SandboxID != m.Rec.ID || p.LeaseID != m.Rec.LeaseID || len(p.Checks) == 0 {
			t.Errorf("proof of member %s: %+v", m.Rec.ID, p)
		}
	}
	if left, _ := r.n.warmMembers(); len(left) != 0 {
		t.Fatalf("members left after the takeover: %+v", left)
	}
	r.checkClean("after the takeover destroyed the members")
	if l := r.ledger(); l.Warm != (Capacity{}) {
		t.Fatalf("warm capacity after the takeover: %+v", l.Warm)
	}
}

// TestWarmPoolTakeoverMidBoot: a term that ends while a member boots
// (crash at its runsc step) leaves it to the next, which destroys it with
// a clean proof.
func TestWarmPoolTakeoverMidBoot(t *testing.T) {
	r := warmRig(t, 1, 0)
	r.arm("runsc:made")
	r.mustBoot()
	for deadline := time.Now().Add(r.k.timeout); r.lastCrash() != "runsc:made"; {
		if time.Now().After(deadline) {
			t.Fatal("the member's boot never reached runsc:made")
		}
		time.Sleep(time.Millisecond)
	}
	ms, err := r.n.warmMembers()
	if err != nil || len(ms) != 1 || ms[0].State != journal.WarmBooting {
		t.Fatalf("members after the crash: %+v %v, want one booting", ms, err)
	}
	r.arm("")
	r.k.warm = warm.Settings{}
	r.mustBoot()
	r.checkProof("warm-destroy-" + ms[0].Rec.ID)
	r.checkClean("after the takeover destroyed the half booted member")
}

// TestWarmPoolCountsInAdmission: members hold their capacity (the
// ledger's warm row), and a claim that fits only without the idle members
// displaces them: the member is destroyed with a clean signed proof
// (warm-destroy-<member>) before the claim is admitted, no member boots
// into the room while the claim holds it (the filler may boot every
// millisecond here), and the pool refills once the claim released it.
func TestWarmPoolCountsInAdmission(t *testing.T) {
	r := warmRig(t, 1, time.Millisecond)
	r.k.warmRes = journal.Resources{CPUMillis: testTotal.CPUMillis - 100, MemoryBytes: 256 << 20, PIDs: 64}
	r.mustBoot()
	m := waitMembers(t, r, 1)[0]
	if l := r.ledger(); l.Warm.CPUMillis != testTotal.CPUMillis-100 || l.Leased != (Capacity{}) {
		t.Fatalf("ledger: warm %+v leased %+v", l.Warm, l.Leased)
	}
	req := claimReq("c1", 1) // 200m, 128 MiB: below a member's memory, so cold
	got := r.mustClaim("sb", req).Sandbox
	if got.State != journal.StateReady || got.WarmMember != "" {
		t.Fatalf("claim of 200m beside a member of %dm: %+v, want a ready cold claim", testTotal.CPUMillis-100, got)
	}
	if p := r.checkProof("warm-destroy-" + m.Rec.ID); p.LeaseID != m.Rec.LeaseID {
		t.Errorf("proof of the displaced member names lease %s, want %s", p.LeaseID, m.Rec.LeaseID)
	}
	time.Sleep(100 * time.Millisecond) // ~100 filler rounds
	if ms, err := r.n.warmMembers(); err != nil || len(ms) != 0 {
		t.Errorf("members while the claim holds the room: %+v %v, want none", ms, err)
	}
	if l := r.ledger(); l.Warm != (Capacity{}) || l.Leased.CPUMillis != req.Resources.CPUMillis {
		t.Errorf("ledger beside the claim: warm %+v leased %+v", l.Warm, l.Leased)
	}
	r.mustRelease("sb", "r1", 1)
	r.checkProof("r1")
	if n := waitMembers(t, r, 1)[0]; n.Rec.ID == m.Rec.ID {
		t.Errorf("the displaced member %s is in the pool again", m.Rec.ID)
	}
}

// TestWarmPoolKeptForAClaimTooBig: a claim that would not fit even
// without the idle members is refused as capacity_exhausted and costs the
// pool nothing (the member is the same one, no proof of its destruction).
func TestWarmPoolKeptForAClaimTooBig(t *testing.T) {
	r := warmRig(t, 1, 0)
	r.mustBoot()
	m := waitMembers(t, r, 1)[0]
	req := claimReq("c1", 1)
	req.Resources.CPUMillis = r.ledger().Allocatable.CPUMillis + 1
	if _, err, _ := r.claim("sb", req); errdefs.CodeOf(err) != errdefs.CodeCapacityExhausted {
		t.Fatalf("claim of more cpu than the node has: %v, want capacity_exhausted", err)
	}
	if ms := waitMembers(t, r, 1); ms[0].Rec.ID != m.Rec.ID {
		t.Errorf("member %s after the refused claim, want %s kept", ms[0].Rec.ID, m.Rec.ID)
	}
	if _, err := r.n.Proof(context.Background(), "warm-destroy-"+m.Rec.ID); errdefs.CodeOf(err) != errdefs.CodeNotFound {
		t.Errorf("proof of member %s: %v, want not_found (destroyed for a claim that could not fit anyway?)", m.Rec.ID, err)
	}
}

// TestWarmPoolDeadMemberFallsBackCold: a claim that takes a member whose
// guest died (its agent does not answer the claim) does not fail: the
// member's objects are destroyed with a clean signed proof
// (warm-destroy-<member>), the claim is made cold and is ready, counted as
// a miss; its release leaves nothing.
func TestWarmPoolDeadMemberFallsBackCold(t *testing.T) {
	r := warmRig(t, 1, time.Hour)
	r.mustBoot()
	m := waitMembers(t, r, 1)[0]
	r.k.killGuest(t, m.Rec.ContainerID)

	got := r.mustClaim("sb", claimReq("c1", 1)).Sandbox
	if got.State != journal.StateReady || got.WarmMember != "" || got.ContainerID != containerID("sb", 1) {
		t.Fatalf("claim of a dead member: %+v, want a ready cold claim", got)
	}
	p := r.checkProof("warm-destroy-" + m.Rec.ID)
	if p.LeaseID != m.Rec.LeaseID || len(p.Checks) == 0 {
		t.Errorf("proof of the dead member: %+v", p)
	}
	if ms, err := r.n.warmMembers(); err != nil || len(ms) != 0 {
		t.Errorf("members after the fallback: %+v %v, want none (no refill within the test)", ms, err)
	}
	for k, e := range r.effects() {
		if e.Name == m.Rec.ContainerID {
			t.Errorf("effect record %s of the dead member left: %+v", k, e)
		}
	}
	want := asCapacity(claimReq("c1", 1).Resources)
	want.PIDs += r.n.cfg.RuntimePIDs
	want.Addresses = 1
	if l := r.ledger(); l.Leased != want || l.Warm != (Capacity{}) || l.Withheld != (Capacity{}) {
		t.Fatalf("ledger after the fallback: leased %+v warm %+v withheld %+v, want leased %+v only", l.Leased, l.Warm, l.Withheld, want)
	}
	st, err := r.n.WarmPools()
	if s := st["busybox"]; err != nil || s.Hits != 0 || s.Misses != 1 {
		t.Fatalf("pool stats %+v %v, want 0 hits and 1 miss", s, err)
	}
	if nd, err := r.n.Node(context.Background()); err != nil || nd.WarmPools["busybox"] != st["busybox"] {
		t.Fatalf("node info's warm pools %+v %v, want %+v", nd.WarmPools, err, st)
	}
	ctx, cancel := r.ctx()
	defer cancel()
	var out bytes.Buffer
	if code, err := r.n.Exec(ctx, "sb", ExecRequest{Args: []string{"cat"}, Stdin: []byte("in")}, &out, &out); err != nil || code != 0 || out.String() != "in" {
		t.Fatalf("exec in the cold fallback: %d %v %q", code, err, out.String())
	}
	r.mustRelease("sb", "r1", 1)
	r.checkProof("r1")
	if u := r.allUnjournaled(); len(u) > 0 {
		t.Errorf("unjournaled objects: %v", u)
	}
	r.checkClean("after the fallback's release")
}

// TestWarmPoolMemberExpiresAndRefills: an idle member older than MaxAge
// is destroyed with a clean signed cleanup proof (warm-destroy-<member>)
// and the pool boots a fresh one in its place without any other event
// (a new template generation reaches the pool this way).
func TestWarmPoolMemberExpiresAndRefills(t *testing.T) {
	tk, _ := fakeKernel(t)
	tk.warm = warm.Settings{Sizes: map[string]int{"busybox": 1}, MaxAge: 200 * time.Millisecond}
	r := newRig(t, tk)
	r.mustBoot()
	old := waitMembers(t, r, 1)[0]
	var fresh journal.WarmMember
	for deadline := time.Now().Add(r.k.timeout); ; {
		ms, err := r.n.warmMembers()
		if err != nil {
			t.Fatal(err)
		}
		if len(ms) == 1 && ms[0].Rec.ID != old.Rec.ID && ms[0].State == journal.WarmIdle {
			fresh = ms[0]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("members %+v: member %s never expired and was replaced", ms, old.Rec.ID)
		}
		time.Sleep(5 * time.Millisecond)
	}
	p := r.checkProof("warm-destroy-" + old.Rec.ID)
	if p.SandboxID != old.Rec.ID || p.LeaseID != old.Rec.LeaseID || len(p.Checks) == 0 {
		t.Errorf("proof of the expired member: %+v", p)
	}
	for k, e := range r.effects() {
		if e.Name == old.Rec.ContainerID {
			t.Errorf("effect record %s of the expired member left: %+v", k, e)
		}
	}
	if fresh.Since.Sub(old.Since) < tk.warm.MaxAge {
		t.Errorf("replacement idle %v after the expired one, want at least MaxAge %v", fresh.Since.Sub(old.Since), tk.warm.MaxAge)
	}
	if u := r.allUnjournaled(); len(u) > 0 {
		t.Errorf("unjournaled objects: %v", u)
	}
}

// TestWarmPoolRefillRate: a pool filling from empty starts its member
// boots at least RefillEvery apart: three members take at least two
// intervals from the term's start, and the journal's CreatedAt of each
// (stamped just after its boot was decided, so half an interval of
// slack for a loaded machine) are that far apart.
func TestWarmPoolRefillRate(t *testing.T) {
	const every = 300 * time.Millisecond
	r := warmRig(t, 3, every)
	start := time.Now()
	r.mustBoot()
	ms := waitMembers(t, r, 3)
	if took := time.Since(start); took < 2*every {
		t.Errorf("three members idle %v after the term began, want at least two refill intervals (%v)", took, 2*every)
	}
	var at []time.Time
	for _, m := range ms {
		at = append(at, m.Rec.CreatedAt)
	}
	slices.SortFunc(at, time.Time.Compare)
	for i := 1; i < len(at); i++ {
		if gap := at[i].Sub(at[i-1]); gap < every/2 {
			t.Errorf("member boots %d and %d started %v apart, want about %v", i-1, i, gap, every)
		}
	}
}

// TestWarmPoolBudget: the budget caps the members of all pools together
// (two templates of 2 each, budget 3: three members, never a fourth), and
// the ledger's warm row is three members' worth.
func TestWarmPoolBudget(t *testing.T) {
	tk, _ := fakeKernel(t)
	for _, d := range []string{"bin", "tmp"} {
		if err := os.MkdirAll(filepath.Join(tk.templatesDir, "other", d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	tk.warm = warm.Settings{Sizes: map[string]int{"busybox": 2, "other": 2}, Budget: 3}
	r := newRig(t, tk)
	r.mustBoot()
	waitMembers(t, r, 3)
	// The filler had its chance at a fourth (1 ms refill): none came.
	time.Sleep(100 * time.Millisecond)
	ms := waitMembers(t, r, 3)
	per := map[string]int{}
	for _, m := range ms {
		per[m.Rec.RootFS.Template]++
	}
	if per["busybox"] < 1 || per["other"] < 1 {
		t.Errorf("members per template %v: want both pools served", per)
	}
	want := memberHeld(r)
	want = Capacity{CPUMillis: 3 * want.CPUMillis, MemoryBytes: 3 * want.MemoryBytes, PIDs: 3 * want.PIDs, DiskBytes: 3 * want.DiskBytes, Addresses: 3 * want.Addresses}
	if l := r.ledger(); l.Warm != want {
		t.Errorf("warm row %+v, want three members' %+v", l.Warm, want)
	}
}

// TestWarmPoolRefillsAfterTheClaim: the refill of a member a claim took
// starts once that claim is answered, not beside its agent round trip
// (in the test VM a member boot beside it doubled the round trip: the
// demo's warm claims' 1.0-2.5 s). The filler may boot
// every millisecond here; while the claim's agent call is held, no member
// is journaled; once it answers, the pool refills.
func TestWarmPoolRefillsAfterTheClaim(t *testing.T) {
	tk, fk := fakeKernel(t)
	tk.warm = warm.Settings{Sizes: map[string]int{"busybox": 1}, RefillEvery: time.Millisecond}
	r := newRig(t, tk)
	r.mustBoot()
	m := waitMembers(t, r, 1)[0]
	held, release := fk.HoldClaims()
	defer release()
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.mustClaim("sb", claimReq("c1", 1))
	}()
	select {
	case id := <-held:
		if id != m.Rec.ContainerID {
			t.Fatalf("held claim in %s, want member %s", id, m.Rec.ContainerID)
		}
	case <-time.After(r.k.timeout):
		t.Fatal("the claim never reached the member's agent")
	}
	// Long enough for the filler (refill every 1 ms) to have started a
	// boot had it been kicked: it journals a member before making it.
	time.Sleep(200 * time.Millisecond)
	ms, err := r.n.warmMembers()
	release()
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range ms {
		t.Errorf("member %s (%s) journaled while the claim's agent call ran", x.Rec.ID, x.State)
	}
	<-done
	if n := waitMembers(t, r, 1)[0]; n.Rec.ID == m.Rec.ID {
		t.Fatalf("the taken member %s is in the pool again", m.Rec.ID)
	}
	r.mustRelease("sb", "r1", 1)
	r.checkProof("r1")
}

// TestWarmPoolDestroyOfATakenMember: a destroy asked for a member that a
// claim took since it was read (the filler's expiry beside a claim)
// removes nothing: it answers errMemberGone, journals no proof, and the
// claim's generation stays ready and releases clean.
func TestWarmPoolDestroyOfATakenMember(t *testing.T) {
	r := warmRig(t, 1, time.Hour)
	r.mustBoot()
	m := waitMembers(t, r, 1)[0]
	if got := r.mustClaim("sb", claimReq("c1", 1)).Sandbox; got.WarmMember != m.Rec.ID {
		t.Fatalf("claim took member %q, want %s", got.WarmMember, m.Rec.ID)
	}
	ctx, cancel := r.ctx()
	defer cancel()
	if _, err := r.n.destroyMember(ctx, m, "expired"); !errors.Is(err, errMemberGone) {
		t.Fatalf("destroy of a taken member: %v, want errMemberGone", err)
	}
	if _, err := r.n.Proof(ctx, "warm-destroy-"+m.Rec.ID); errdefs.CodeOf(err) != errdefs.CodeNotFound {
		t.Errorf("proof of the taken member: %v, want not_found", err)
	}
	if !strings.Contains(r.k.text(), m.Rec.ContainerID) {
		t.Errorf("the claim's container %s is gone from the kernel:\n%s", m.Rec.ContainerID, r.k.text())
	}
	r.mustRelease("sb", "r1", 1)
	r.checkProof("r1")
}

// TestWarmPoolYieldsToClaims: claims come first: no member boots while a
// claim runs nor within RefillEvery after the last one (back-to-back
// claims beside the refill's boots ran at 0.82x of no pool in the test
// VM), then the pool refills.
func TestWarmPoolYieldsToClaims(t *testing.T) {
	const quiet = 300 * time.Millisecond
	r := warmRig(t, 2, quiet)
	r.mustBoot()
	waitMembers(t, r, 2)
	time.Sleep(quiet) // past the refill rate's bound since the last boot
	for i, id := range []string{"sb1", "sb2"} {
		if got := r.mustClaim(id, claimReq(fmt.Sprintf("c%d", i), 1)).Sandbox; got.WarmMember == "" {
			t.Fatalf("claim %s went cold: want both members taken", id)
		}
	}
	ended := time.Now()
	for time.Since(ended) < quiet*2/3 {
		if ms, err := r.n.warmMembers(); err != nil || len(ms) != 0 {
			t.Fatalf("%v after the last claim: members %+v (%v), want none booted yet", time.Since(ended).Round(time.Millisecond), ms, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	waitMembers(t, r, 2)
	for i, id := range []string{"sb1", "sb2"} {
		r.mustRelease(id, fmt.Sprintf("r%d", i), 1)
	}
}
