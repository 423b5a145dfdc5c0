package node

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/netpolicy"
	"github.com/ctld/ctld/internal/node/fakekernel"
	"github.com/ctld/ctld/internal/node/guest"
	"github.com/ctld/ctld/internal/node/network"
	"github.com/ctld/ctld/internal/node/overlay"
	"github.com/ctld/ctld/internal/node/writers"
)

// The fake kernel is what the interfaces say.
var (
	_ guest.Leases      = (*fakekernel.Leases)(nil)
	_ overlay.RootFS    = (*fakekernel.RootFS)(nil)
	_ guest.Runtime     = (*fakekernel.Runtime)(nil)
	_ writers.Devices   = (*fakekernel.Blocks)(nil)
	_ writers.Mounts    = (*fakekernel.BlockMounts)(nil)
	_ writers.Templates = (*fakekernel.Templates)(nil)
)

// fakeKernel is a testKernel over a new fake kernel.
func fakeKernel(t testing.TB) (*testKernel, *fakekernel.Kernel) {
	t.Helper()
	k, err := fakekernel.New(fastTempDir(t))
	if err != nil {
		t.Fatal(err)
	}
	return &testKernel{
		leases: k.Leases(), rootfs: k.RootFS(), netns: k.Netns(), runtime: k.Runtime(),
		links: k.Links(), firewall: k.Firewall(), flows: k.Flows(), pool: testPool,
		dns:    func() network.DNSProxy { k.RestartDNSProxy(); return k.DNSProxy() },
		runDir: k.RunDir(), templatesDir: k.TemplatesDir(), agentBinary: k.AgentBinary(),
		text:      k.String,
		killGuest: func(_ testing.TB, cid string) { k.KillGuest(cid) },
		failProbe: func(_ testing.TB, req *journal.ClaimRequest) {
			k.FailMake(fakekernel.KindExec, containerID(sb, req.Generation), nil)
		},
		timeout: 10 * time.Second,
		block:   k.Blocks(), blockMounts: k.BlockMounts(), templates: k.Templates(), writersDir: k.WritersDir(),
		volumes: k.Volumes(), sealer: k.Sealer(), freezer: k.Freezer(),
		pvolumes: k.PVolumes(), volumeMounts: k.VolumeMounts(), volumeFreezer: k.VolumeMounts(),
		// The fake's dead writers are seen at once.
		blockStore: BlockConfig{CheckEvery: 10 * time.Millisecond},
	}, k
}

// blockKernel is fakeKernel whose claims are block-mode ones.
func blockKernel(t testing.TB) (*testKernel, *fakekernel.Kernel) {
	tk, k := fakeKernel(t)
	tk.blockMode = true
	return tk, k
}

// kernelModes are the fake kernels of each RootFS mode.
var kernelModes = []struct {
	name string
	make func(testing.TB) (*testKernel, *fakekernel.Kernel)
}{{"overlay", fakeKernel}, {"block", blockKernel}}

// TestCrashPoints walks every crash point of the node in every case that
// passes it: the operation dies at the point, the next term reconciles,
// and the outcome must be the same as if nothing had crashed (a claim
// rolled back with a clean proof, a release completed with a clean proof,
// orphans gone), with the kernel empty and the capacity back. The
// volumes entry's points run with a persistent volume attached. Each case
// also crashes a second time at the same point during the recovery.
func TestCrashPoints(t *testing.T) {
	covered, ran := map[string]bool{}, map[string]bool{}
	for _, mode := range kernelModes {
		for _, point := range testCrashPoints() {
			if tk, _ := mode.make(t); !pointApplies(point, tk.mode()) {
				continue // an entry of the other RootFS mode
			}
			for _, c := range crashCases {
				for _, crashes := range []int{1, 2} {
					name := mode.name + "/" + subtestName(point) + "/" + c.name
					if crashes == 2 {
						name += "/twice"
					}
					t.Run(name, func(t *testing.T) {
						ran[point] = true
						k, fk := mode.make(t)
						if isVolumePoint(point) {
							fk.CreateVolume("data")
							k.volume = "data"
						}
						if runCrashCase(t, k, c, point, crashes) {
							covered[point] = true
							t.Logf("crashed at %s in case %s", point, c.name)
						} else if c.covers(point) {
							t.Errorf("case %s never passed crash point %s", c.name, point)
						}
					})
				}
			}
		}
	}
	for _, p := range testCrashPoints() {
		if ran[p] && !covered[p] {
			t.Errorf("no case reaches crash point %s", p)
		}
	}
}

// TestCrashChains: a crash at each point of a teardown (or of a sweep),
// one after the other in the recoveries of one release (or sweep), still
// ends clean, also with a persistent volume attached (the volumes
// entry's points are no-ops without one). The VM covers those points
// this way.
func TestCrashChains(t *testing.T) {
	for _, mode := range kernelModes {
		full, _ := mode.make(t)
		for _, c := range crashChains(full) {
			for _, vol := range []bool{false, true} {
				name, points := mode.name+"/"+c.c.name, c.points
				if vol {
					if !slices.ContainsFunc(points, isVolumePoint) {
						continue
					}
					name += "/volume"
				} else {
					points = slices.DeleteFunc(slices.Clone(points), isVolumePoint)
				}
				t.Run(name, func(t *testing.T) {
					k, fk := mode.make(t)
					if vol {
						fk.CreateVolume("data")
						k.volume = "data"
					}
					runCrashChain(t, k, c.c, points)
				})
			}
		}
	}
}

// TestReconcileReadoptsReadyGeneration: a ready generation whose guest
// runs is re-adopted by the next term as it is, and serves.
func TestReconcileReadoptsReadyGeneration(t *testing.T) {
	tk, k := fakeKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	resp := r.mustClaim(sb, claimReq("c1", 1))
	before := k.String()
	k.Calls() // forget the claim's
	r.mustBoot()
	if calls := k.Calls(); len(calls) > 0 {
		t.Errorf("re-adopting changed the kernel: %v", calls)
	}
	s := r.sandbox(sb)
	if s.State != journal.StateReady || s.ContainerID != resp.Sandbox.ContainerID {
		t.Fatalf("after takeover: %s %s (%s), want ready %s", s.State, s.ContainerID, s.Reason, resp.Sandbox.ContainerID)
	}
	if after := k.String(); after != before {
		t.Fatalf("takeover changed the kernel:\n%s\nwas:\n%s", after, before)
	}
	execThenRelease(r)
}

// execThenRelease: the re-adopted generation of sb runs an exec, then its
// release (r1 of generation 1) proves it clean and leaves nothing.
func execThenRelease(r *rig) {
	r.t.Helper()
	var out strings.Builder
	code, err := r.n.Exec(context.Background(), sb, ExecRequest{Args: []string{"/bin/echo", "hi"}}, &out, &out)
	if err != nil || code != 0 || out.String() != "hi\n" {
		r.t.Fatalf("exec after takeover: %d %q %v", code, out.String(), err)
	}
	r.mustRelease(sb, "r1", 1)
	r.checkProof("r1")
	r.checkClean("after release")
	checkUnjournaled(r, crashCase{})
}

// TestReconcileLostGeneration: a ready generation whose guest died is
// lost: the next term tears it down, and a clean proof ends it as
// released (the reason says lost) and returns its capacity.
func TestReconcileLostGeneration(t *testing.T) {
	tk, k := fakeKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	resp := r.mustClaim(sb, claimReq("c1", 1))
	k.KillGuest(resp.Sandbox.ContainerID)
	r.mustBoot()
	s := r.sandbox(sb)
	if s.State != journal.StateReleased || s.Withheld || !strings.Contains(s.Reason, "lost") {
		t.Fatalf("after takeover: %s withheld=%v (%s), want released as lost", s.State, s.Withheld, s.Reason)
	}
	r.checkProof("lost-" + resp.Sandbox.ContainerID)
	r.checkClean("after the lost generation")
	checkUnjournaled(r, crashCase{})
	reuse(r, 2)
}

// TestWithheldUntilRemovalSucceeds: an object that refuses removal makes
// the release's proof unclean: the generation is withheld (its capacity
// too), the release's answer says so and stays the same; once the object
// can go, the next takeover's retry proves the cleanup and returns the
// capacity.
func TestWithheldUntilRemovalSucceeds(t *testing.T) {
	for _, kind := range []journal.Kind{journal.KindRunsc, journal.KindMount, journal.KindNetns, journal.KindCgroup, journal.KindDisk,
		journal.KindLinks, journal.KindNft, journal.KindConntrack} {
		t.Run(string(kind), func(t *testing.T) {
			tk, k := fakeKernel(t)
			r := newRig(t, tk)
			r.mustBoot()
			resp := r.mustClaim(sb, claimReq("c1", 1))
			name := resp.Sandbox.ContainerID
			switch kind {
			case journal.KindDisk:
				name = fmtProject(r.sandbox(sb).DiskProject)
			case journal.KindConntrack: // flows are named by the slot's mark
				slot := r.sandbox(sb).Slot
				name = fmtProject(slot)
				k.AddFlow(netpolicy.Slot(slot), fakekernel.Flow{Proto: netpolicy.ProtoTCP, Dst: netip.MustParseAddrPort("203.0.113.7:443")})
			}
			k.Refuse(kind, name, nil)
			rel, err, _ := r.release(sb, "r1", 1)
			if err != nil {
				t.Fatalf("release: %v", err)
			}
			if rel.Proof.Clean || rel.Sandbox.State != journal.StateReleased {
				t.Fatalf("release with a %s refusing removal: clean=%v state %s", kind, rel.Proof.Clean, rel.Sandbox.State)
			}
			if s := r.sandbox(sb); !s.Withheld {
				t.Fatalf("not withheld: %+v", s)
			}
			nd, _ := r.n.Node(context.Background())
			if len(nd.Withheld) != 1 || nd.Capacity.Withheld.CPUMillis != 200 {
				t.Fatalf("withheld ledger: %+v %+v", nd.Withheld, nd.Capacity.Withheld)
			}
			if !strings.Contains(k.String(), strings.TrimSuffix(string(kind), "s")) { // "link ctl-…"
				t.Fatalf("the refused %s is not in the kernel:\n%s", kind, k)
			}
			again, err, _ := r.release(sb, "r1", 1)
			if err != nil || again.Proof.Clean || again.Proof.Signature == nil && rel.Proof.Signature != nil {
				t.Fatalf("retry of release r1: %+v %v", again, err)
			}
			// Still refused: the takeover's retry keeps it withheld (its
			// Reconcile may say what it could not remove).
			if returned, err := r.boot(); !returned {
				t.Fatalf("takeover crashed at %q", r.lastCrash())
			} else if err != nil {
				t.Logf("takeover with a %s refusing removal: %v", kind, err)
			}
			if s := r.sandbox(sb); !s.Withheld {
				t.Fatalf("a takeover released a withheld generation whose %s is still there", kind)
			}
			k.Allow(kind, name)
			r.mustBoot()
			if s := r.sandbox(sb); s.Withheld || s.State != journal.StateReleased {
				t.Fatalf("after the object could go: %s withheld=%v (%s)", s.State, s.Withheld, s.Reason)
			}
			r.checkProof(retryOp(resp.Sandbox.ContainerID))
			r.checkClean("after the withheld generation was proven clean")
			reuse(r, 2)
		})
	}
}

// TestClaimStepFailureRollsBack: a claim whose step fails is rolled back
// at once, nothing is left, and the operation's stored answer is the
// step's error.
func TestClaimStepFailureRollsBack(t *testing.T) {
	for _, kind := range []journal.Kind{journal.KindCgroup, journal.KindDisk, journal.KindMount, journal.KindNetns,
		journal.KindLinks, journal.KindNft, journal.KindRunsc, fakekernel.KindExec} {
		t.Run(string(kind), func(t *testing.T) {
			tk, k := fakeKernel(t)
			r := newRig(t, tk)
			r.mustBoot()
			k.FailMake(kind, containerID(sb, 1), nil)
			_, err, _ := r.claim(sb, claimReq("c1", 1))
			if err == nil || !strings.Contains(err.Error(), "injected") {
				t.Fatalf("claim with %s failing: %v", kind, err)
			}
			claimFailed(r, claimReq("c1", 1), errdefs.CodeOf(err))
			r.checkClean("after the rollback")
			k.ClearFailMake(kind, containerID(sb, 1))
			reuse(r, 2)
		})
	}
}
