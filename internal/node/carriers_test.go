package node

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/netpolicy"
	"github.com/ctld/ctld/internal/node/fakekernel"
	"github.com/ctld/ctld/internal/node/network"
)

// carrierRig is a fake-kernel rig whose node keeps size warm carriers.
func carrierRig(t *testing.T, size int) (*rig, *fakekernel.Kernel) {
	tk, k := fakeKernel(t)
	tk.carriers = size
	return newRig(t, tk), k
}

// waitCarriers waits until the ready carriers are exactly want and none
// is being made or removed.
func waitCarriers(t *testing.T, r *rig, want ...uint32) {
	t.Helper()
	var got []journal.Carrier
	for deadline := time.Now().Add(30 * time.Second); ; {
		got = nil
		if err := r.j.View(func(tx *journal.Tx) (err error) { got, err = tx.Carriers(); return err }); err != nil {
			t.Fatal(err)
		}
		var slots []uint32
		whole := true
		for _, c := range got {
			slots = append(slots, c.Slot)
			whole = whole && c.State == journal.CarrierReady
		}
		if whole && slices.Equal(slots, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("carriers %+v, want ready slots %v", got, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// checkOnlyCarriers: the kernel holds only the ready carriers on
// slots, their netns and link (alias carrier-g<slot>), and nothing is unjournaled.
func checkOnlyCarriers(t *testing.T, r *rig, k *fakekernel.Kernel, slots ...uint32) {
	t.Helper()
	var lines []string
	for _, l := range strings.Split(k.String(), "\n") {
		if l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) != 2*len(slots) {
		t.Errorf("kernel holds %d objects, want the %d of carriers %v:\n%s", len(lines), 2*len(slots), slots, k.String())
	}
	for _, s := range slots {
		for _, w := range []string{
			fmt.Sprintf("netns %s net:[", network.CarrierNetns(s)),
			fmt.Sprintf("link %s alias carrier-g%d peer eth0", netpolicy.LinkName(netpolicy.Slot(s)), s),
		} {
			if !strings.Contains(k.String(), w) {
				t.Errorf("kernel lacks %q:\n%s", w, k.String())
			}
		}
	}
	if u := r.allUnjournaled(); len(u) > 0 {
		t.Errorf("objects found that the journal did not name: %v", u)
	}
}

// TestCarrierTakeAndRefill: after the takeover the pool fills; a claim
// takes the lowest carrier (its slot and netns, no netns or veth made in
// the claim) and only applies its policy; the pool is refilled with a new
// slot; the release destroys the taken carrier (single-use: the next claim
// gets another one) and leaves only the warm carriers.
func TestCarrierTakeAndRefill(t *testing.T) {
	r, k := carrierRig(t, 2)
	r.mustBoot()
	waitCarriers(t, r, 1, 2)
	checkOnlyCarriers(t, r, k, 1, 2)
	k.Calls()
	resp := r.mustClaim(sb, claimReq("c1", 1))
	s := r.sandbox(sb)
	if s.Slot != 1 || s.Netns != network.CarrierNetns(1) || s.NetnsIno == 0 {
		t.Fatalf("claim took slot %d netns %q (ino %d), want carrier 1's", s.Slot, s.Netns, s.NetnsIno)
	}
	if resp.Sandbox.Timings.NetworkMS < 0 {
		t.Errorf("network step %v ms", resp.Sandbox.Timings.NetworkMS)
	}
	waitCarriers(t, r, 2, 3)
	calls := k.Calls()
	for _, c := range calls {
		if c == "netns create "+containerID(sb, 1) || strings.HasPrefix(c, "link make ctl-00001") {
			t.Errorf("the claim made its network although it took a carrier: %q", calls)
		}
	}
	for _, w := range []string{"nft apply sb-sb-g1", "link make ctl-00003 carrier-g3"} {
		if !slices.ContainsFunc(calls, func(c string) bool { return strings.HasPrefix(c, w) }) {
			t.Errorf("calls %q lack %q", calls, w)
		}
	}
	if !strings.Contains(k.String(), "nft dispatch ctl-00001 goto sb-sb-g1") {
		t.Errorf("the generation's policy does not dispatch on the carrier's link:\n%s", k.String())
	}
	r.mustRelease(sb, "r1", 1)
	r.checkProof("r1")
	calls = k.Calls()
	for _, w := range []string{"link remove ctl-00001", "netns delete " + network.CarrierNetns(1)} {
		if !slices.Contains(calls, w) {
			t.Errorf("release calls %q lack %q", calls, w)
		}
	}
	// Slot 1 is free again; the pool is full with 2 and 3, so slot 1 is
	// not made again until a claim takes one.
	waitCarriers(t, r, 2, 3)
	checkOnlyCarriers(t, r, k, 2, 3)
	r.mustClaim("b", claimReq("cb", 1))
	if s := r.sandbox("b"); s.Slot != 2 {
		t.Errorf("the next claim got slot %d, want carrier 2", s.Slot)
	}
	waitCarriers(t, r, 1, 3) // the refill takes the lowest free slot: a new carrier 1
	r.mustRelease("b", "rb", 1)
	waitCarriers(t, r, 1, 3)
	checkOnlyCarriers(t, r, k, 1, 3)
	if nd, _ := r.n.Node(t.Context()); nd.Capacity.Leased.CPUMillis != 0 {
		t.Errorf("carriers count against leases: %+v", nd.Capacity.Leased)
	}
}

// TestCarrierPoolBoundedByAddresses: carriers take only slots no
// generation holds; claims take carriers before free slots, so the pool
// never keeps a claim out; a full address pool refuses the next claim and
// a release lets the pool refill.
func TestCarrierPoolBoundedByAddresses(t *testing.T) {
	r, k := carrierRig(t, 3)
	r.mustBoot()
	waitCarriers(t, r, 1, 2, 3)
	total := int(testPool.Len()) // 7
	slots := map[uint32]string{}
	for i := 1; i <= total; i++ {
		id := fmt.Sprintf("s%d", i)
		r.mustClaim(id, claimReq("c"+id, 1))
		s := r.sandbox(id)
		if s.Slot == 0 || slots[s.Slot] != "" {
			t.Fatalf("%s got slot %d (already %q's)", id, s.Slot, slots[s.Slot])
		}
		slots[s.Slot] = id
	}
	waitCarriers(t, r) // no free slot left for a carrier
	if _, err, _ := r.claim("full", claimReq("cfull", 1)); errdefs.CodeOf(err) != errdefs.CodeCapacityExhausted {
		t.Fatalf("claim with every slot held: %v, want capacity_exhausted", err)
	}
	r.mustRelease("s4", "r4", 1)
	waitCarriers(t, r, slotOf(slots, "s4"))
	// 6 generations' links (each a taken carrier's: the alias stays
	// carrier-g<slot>) and the new carrier's.
	if got := strings.Count(k.String(), "link ctl-"); got != total {
		t.Errorf("%d links, want %d:\n%s", got, total, k.String())
	}
}

func slotOf(m map[uint32]string, id string) uint32 {
	for s, v := range m {
		if v == id {
			return s
		}
	}
	return 0
}

// TestCarrierAdoptedOnTakeover: a new primary keeps the ready carriers
// as they are (no netns or veth made again) and destroys a broken one
// (its link gone), then refills.
func TestCarrierAdoptedOnTakeover(t *testing.T) {
	r, k := carrierRig(t, 2)
	r.mustBoot()
	waitCarriers(t, r, 1, 2)
	before := k.String()
	k.Calls()
	r.mustBoot()
	waitCarriers(t, r, 1, 2)
	if calls := k.Calls(); len(calls) > 0 && slices.ContainsFunc(calls, func(c string) bool { return strings.HasPrefix(c, "netns create") || strings.HasPrefix(c, "link make") }) {
		t.Errorf("the takeover made carriers again: %q", calls)
	}
	if after := k.String(); after != before {
		t.Errorf("the takeover changed the carriers:\n%s\nwas:\n%s", after, before)
	}
	// Break carrier 2: its veth is gone.
	if err := k.Links().Remove(t.Context(), netpolicy.LinkName(2)); err != nil {
		t.Fatal(err)
	}
	r.mustBoot()
	waitCarriers(t, r, 1, 2)
	calls := k.Calls()
	for _, w := range []string{"netns delete " + network.CarrierNetns(2), "netns create " + network.CarrierNetns(2)} {
		if !slices.Contains(calls, w) {
			t.Errorf("takeover calls %q lack %q (broken carrier destroyed and made again)", calls, w)
		}
	}
	checkOnlyCarriers(t, r, k, 1, 2)
}

// TestCarrierCrashPoints: a crash at each point of a carrier's making or
// destruction leaves the next primary a journal it finishes: a carrier not
// journaled ready is destroyed, a ready one adopted, and the pool ends
// full with nothing unjournaled and nothing else in the kernel.
func TestCarrierCrashPoints(t *testing.T) {
	for _, point := range network.CarrierCrashPoints() {
		t.Run(subtestName(point), func(t *testing.T) {
			r, k := carrierRig(t, 1)
			if strings.HasPrefix(point, "carrier:remov") {
				// A broken carrier, destroyed by the takeover.
				r.mustBoot()
				waitCarriers(t, r, 1)
				if err := k.Links().Remove(t.Context(), netpolicy.LinkName(1)); err != nil {
					t.Fatal(err)
				}
				r.arm(point)
				if returned, _ := r.boot(); returned || r.lastCrash() != point {
					t.Fatalf("takeover returned %v, crash at %q; want a crash at %s", returned, r.lastCrash(), point)
				}
			} else {
				r.arm(point)
				r.mustBoot() // the filler crashes in the background
				for deadline := time.Now().Add(5 * time.Second); r.lastCrash() != point; time.Sleep(5 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("no crash at %s", point)
					}
				}
			}
			r.arm("")
			r.mustBoot()
			waitCarriers(t, r, 1)
			checkOnlyCarriers(t, r, k, 1)
			r.mustClaim(sb, claimReq("c1", 1))
			waitCarriers(t, r, 2) // refilled while sb holds slot 1
			r.mustRelease(sb, "r1", 1)
			r.checkProof("r1")
			waitCarriers(t, r, 2)
			checkOnlyCarriers(t, r, k, 2)
		})
	}
}

// TestCarrierUnjournaledSwept: a netns and link under a carrier's names
// that no record names (made by a primary that died before its journal
// write, or by hand) are removed by the orphan sweep and reported.
func TestCarrierUnjournaledSwept(t *testing.T) {
	r, k := carrierRig(t, 0)
	r.mustBoot()
	path, err := k.Netns().Create(t.Context(), network.CarrierNetns(5))
	if err != nil {
		t.Fatal(err)
	}
	r.k.carriers = 1 // the next term keeps a carrier: it must still sweep the stray one
	o := netpolicy.Owner{ID: network.CarrierID, Generation: 5}
	if o.Block, err = testPool.Block(5); err != nil {
		t.Fatal(err)
	}
	if err := k.Links().Make(t.Context(), o, path); err != nil {
		t.Fatal(err)
	}
	r.mustBoot()
	waitCarriers(t, r, 1)
	u := r.allUnjournaled()
	for _, w := range []string{"netns/" + network.CarrierNetns(5), "links/ctl-00005"} {
		if !slices.Contains(u, w) {
			t.Errorf("unjournaled %v lacks %s", u, w)
		}
	}
	r.unjournaled, r.n.unjournaled = nil, nil
	checkOnlyCarriers(t, r, k, 1)
}

// TestCarrierSlotHeldWhileMade: a claim that finds no ready carrier (one
// is still being made) makes its network inline on another slot: a
// carrier's slot is held from the moment its record is journaled.
func TestCarrierSlotHeldWhileMade(t *testing.T) {
	r, k := carrierRig(t, 1)
	reached, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	r.pause = func(p string) {
		if p == "carrier:made" {
			once.Do(func() { close(reached); <-release })
		}
	}
	r.mustBoot()
	<-reached
	r.mustClaim(sb, claimReq("c1", 1))
	if s := r.sandbox(sb); s.Slot != 2 || s.Netns != containerID(sb, 1) {
		t.Errorf("claim beside a carrier being made got slot %d netns %q, want slot 2 and its own netns", s.Slot, s.Netns)
	}
	if !slices.Contains(k.Calls(), "netns create "+containerID(sb, 1)) {
		t.Error("the claim did not make its netns inline")
	}
	close(release)
	waitCarriers(t, r, 1)
	r.mustRelease(sb, "r1", 1)
	r.checkProof("r1")
	checkOnlyCarriers(t, r, k, 1)
}

// TestCarrierLastSlotClaimWaits: a claim that finds no ready carrier and
// no free slot because the filler is making a carrier on the last free
// one waits for that carrier and takes it: the pool never keeps a claim
// out (the CI flake of TestCarrierPoolBoundedByAddresses under load). A
// carrier that is not made within Config.CarrierWait gets the claim
// refused as before.
func TestCarrierLastSlotClaimWaits(t *testing.T) {
	for _, stuck := range []bool{false, true} {
		t.Run(fmt.Sprintf("stuck=%v", stuck), func(t *testing.T) {
			r, k := carrierRig(t, 1)
			r.k.carrierWait = 10 * time.Second
			if stuck {
				r.k.carrierWait = 200 * time.Millisecond
			}
			total := int(testPool.Len()) // 7
			reached, release := make(chan struct{}), make(chan struct{})
			var armed atomic.Bool
			var once sync.Once
			r.pause = func(p string) {
				if p == "carrier:made" && armed.Load() {
					once.Do(func() { close(reached); <-release })
				}
			}
			t.Cleanup(func() {
				select {
				case <-release:
				default:
					close(release)
				}
			})
			r.mustBoot()
			waitCarriers(t, r, 1)
			for i := 1; i <= total-2; i++ {
				id := fmt.Sprintf("s%d", i)
				r.mustClaim(id, claimReq("c"+id, 1))
			}
			// Two free slots left: the pool's one carrier is on one of them.
			waitOneCarrier(t, r, true)
			armed.Store(true)
			// This claim takes the ready carrier; the filler starts making
			// one on the last free slot and is held there.
			r.mustClaim("s6", claimReq("cs6", 1))
			<-reached
			making := waitOneCarrier(t, r, false) // the one on the last free slot
			type result struct {
				err      error
				returned bool
			}
			done := make(chan result, 1)
			go func() {
				_, err, returned := r.claim("s7", claimReq("cs7", 1))
				done <- result{err, returned}
			}()
			if stuck {
				res := <-done
				if errdefs.CodeOf(res.err) != errdefs.CodeCapacityExhausted || !strings.Contains(res.err.Error(), "being made") {
					t.Fatalf("claim with the carrier stuck past CarrierWait: %v, want capacity_exhausted naming the carrier being made", res.err)
				}
				if s, err := r.n.sandbox("s7"); err == nil {
					t.Errorf("the refused claim left a record: %+v", s)
				}
				close(release)
				waitCarriers(t, r, making)
				return
			}
			select {
			case res := <-done:
				t.Fatalf("the claim did not wait for the carrier being made on the last slot: %v", res.err)
			case <-time.After(100 * time.Millisecond):
			}
			close(release)
			res := <-done
			if !res.returned || res.err != nil {
				t.Fatalf("claim on the last slot: returned %v, %v", res.returned, res.err)
			}
			s := r.sandbox("s7")
			if s.Slot != making || s.Netns != network.CarrierNetns(making) {
				t.Errorf("s7 got slot %d netns %q, want the carrier that was being made", s.Slot, s.Netns)
			}
			if slices.Contains(k.Calls(), "netns create "+containerID("s7", 1)) {
				t.Error("s7 made its netns inline, want the carrier's")
			}
			waitCarriers(t, r) // every slot is a generation's
		})
	}
}

// waitOneCarrier waits until the journal holds exactly one carrier (a
// ready one if ready) and returns its slot.
func waitOneCarrier(t *testing.T, r *rig, ready bool) uint32 {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; {
		var cs []journal.Carrier
		if err := r.j.View(func(tx *journal.Tx) (err error) { cs, err = tx.Carriers(); return err }); err != nil {
			t.Fatal(err)
		}
		if len(cs) == 1 && cs[0].State != journal.CarrierRemoving && (!ready || cs[0].State == journal.CarrierReady) {
			return cs[0].Slot
		}
		if time.Now().After(deadline) {
			t.Fatalf("carriers %+v, want one", cs)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestCarrierPoolShrinksOnTakeover: a primary configured with fewer
// carriers than the journal holds destroys the surplus (with none, all).
func TestCarrierPoolShrinksOnTakeover(t *testing.T) {
	r, k := carrierRig(t, 2)
	r.mustBoot()
	waitCarriers(t, r, 1, 2)
	r.k.carriers = 1
	r.mustBoot()
	waitCarriers(t, r, 1)
	checkOnlyCarriers(t, r, k, 1)
	r.k.carriers = 0
	r.mustBoot()
	waitCarriers(t, r)
	r.checkClean("with no carrier configured")
}
