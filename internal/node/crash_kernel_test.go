package node

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/blockvol"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/lease"
	"github.com/ctld/ctld/internal/names"
	"github.com/ctld/ctld/internal/netpolicy"
	"github.com/ctld/ctld/internal/netpolicy/dnsproxy"
	"github.com/ctld/ctld/internal/netpolicy/flows"
	"github.com/ctld/ctld/internal/netpolicy/nft"
	"github.com/ctld/ctld/internal/node/guest"
	"github.com/ctld/ctld/internal/node/network"
	"github.com/ctld/ctld/internal/rootfs"
	"github.com/ctld/ctld/internal/runsc"
	"github.com/ctld/ctld/internal/template"
	"github.com/ctld/ctld/internal/writer"
)

// realKernel is a testKernel over the test VM's kernel, built as ctld's
// run.go builds its deps, under names and dirs of this test only: a lease
// parent of its own, scratch on the VM's XFS with project quotas, netns
// files, runsc root, bundles and logs in temp dirs.
func realKernel(t *testing.T) *testKernel {
	t.Helper()
	bin := ktest.RequireBinary(t, "runsc")
	ktest.RequireCgroup2(t, "cpu", "memory", "pids")
	run := t.TempDir()
	state := ktest.QuotaDir(t)
	runscRoot := filepath.Join(run, "runsc")
	ktest.CheckLeaks(t, ktest.SnapshotOptions{RunscRoots: []string{runscRoot}, RunDir: run, StateDir: state})

	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	leases := &lease.Manager{Parent: "ctld-crash-" + hex.EncodeToString(b[:]) + ".slice"}
	if err := leases.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.Remove(filepath.Join(ktest.CgroupRoot, leases.Parent)); err != nil {
			t.Errorf("remove lease parent: %v", err)
		}
	})
	templates := filepath.Join(run, "templates")
	for _, name := range []string{"busybox", "noecho"} {
		if err := template.BuildBusybox(filepath.Join(templates, name), "/bin/busybox"); err != nil {
			t.Fatal(err)
		}
	}
	// noecho: a root without /bin/echo, which the readiness proof once ran.
	if err := os.Remove(filepath.Join(templates, "noecho", "bin", "echo")); err != nil {
		t.Fatal(err)
	}
	k := realNet()
	// After the leak check's snapshot: the table is the rig's own to
	// delete (ctld never deletes its table).
	t.Cleanup(func() {
		if err := ktest.DeleteNftTable(k.nftTable); err != nil {
			t.Errorf("delete nft table %s: %v", k.nftTable, err)
		}
	})
	*k = testKernel{
		links: k.links, firewall: k.firewall, flows: k.flows, dns: k.dns, pool: k.pool, nftTable: k.nftTable,
		leases:       leases,
		rootfs:       &rootfs.Overlay{ScratchDir: filepath.Join(state, "scratch")},
		netns:        &netpolicy.Netns{Dir: filepath.Join(run, "netns")},
		runtime:      &runsc.Runtime{Binary: bin, Root: runscRoot, SharedRoot: true, HostUDS: "create", Version: runscBuild(bin)},
		runDir:       run,
		agentBinary:  agentBinary(t),
		agentDirs:    TmpfsAgentDirs{},
		agentPeers:   ProcPeers{},
		templatesDir: templates,
		// A project range of this test's own: the sweep clears ctld's
		// range, and other tests run beside this one.
		diskProjects: DiskProjects{Base: 1<<25 + uint32(b[0])<<8 + uint32(b[1]), Count: 64},
		killGuest: func(t testing.TB, cid string) {
			// What an OOM kill of the sandbox does: its processes die, its
			// runsc state stays.
			if err := os.WriteFile(filepath.Join(leases.Dir(cid), "cgroup.kill"), []byte("1"), 0); err != nil {
				t.Fatal(err)
			}
			for i := 0; ; i++ {
				if pop, err := leases.Populated(context.Background(), cid); err == nil && !pop {
					return
				}
				if i == 100 {
					t.Fatalf("lease %s still populated after cgroup.kill", cid)
				}
				time.Sleep(50 * time.Millisecond)
			}
		},
		// A workload that cannot start: the agent refuses ready (or has
		// exited), so the readiness proof never gets the nonce.
		failProbe: func(_ testing.TB, req *journal.ClaimRequest) { req.Process.Args = []string{"/nonexistent/workload"} },
		timeout:   3 * time.Minute,
		showLog:   true, // its step timings are what the VM run measures
		resources: &journal.Resources{CPUMillis: 2000, MemoryBytes: 512 << 20, PIDs: 512, DiskBytes: 64 << 20},
	}
	k.text = func() string { return realText(k) }
	return k
}

// agentBinary is the static ctl-agent the VM harness builds
// ($CTLD_BIN_DIR/ctl-agent).
func agentBinary(t *testing.T) string {
	t.Helper()
	p := filepath.Join(os.Getenv("CTLD_BIN_DIR"), "ctl-agent")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("ctl-agent binary (CTLD_BIN_DIR=%q): %v; run through make test-vm", os.Getenv("CTLD_BIN_DIR"), err)
	}
	return p
}

// realNet is the sandbox network of the real kernel's rig, as ctld's
// buildNet makes it: veth pairs in the VM's root netns, an nft table of
// the rig's own (table, its name unique; realKernel deletes it, which
// ctld never does), conntrack, and a DNS proxy per term that is not
// served (its registry is what the node drives).
func realNet() *testKernel {
	pool := netpolicy.Pool{V4: netip.MustParsePrefix("10.233.0.0/24"), V6: netip.MustParsePrefix("fd00:c71d:e2e::/64")}
	table := "ctld-crash-" + randHex(4)
	fw, err := nft.New(nft.Config{Table: table, DNSPort: 10053, Pool: pool}, nil)
	if err != nil {
		panic(err)
	}
	return &testKernel{
		links: &netpolicy.Links{}, firewall: fw, flows: &flows.Conntrack{}, pool: pool,
		dns: func() network.DNSProxy {
			p, err := dnsproxy.New(dnsproxy.Config{Listen: "127.0.0.1:0", Pool: pool, Upstreams: []string{"127.0.0.1:53"}, Allower: fw})
			if err != nil {
				panic(err)
			}
			return p
		},
		nftTable: table,
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// realText lists the generations' objects the subsystems see (as the
// reconciler does) and their files; ktest.CheckLeaks looks deeper when
// the test ends.
func realText(k *testKernel) string {
	ctx := context.Background()
	var lines []string
	list := func(what string, ids []string, err error) {
		if err != nil {
			lines = append(lines, fmt.Sprintf("%s: %v", what, err))
		}
		for _, id := range ids {
			lines = append(lines, what+" "+id)
		}
	}
	ids, err := k.leases.List(ctx)
	list("cgroup", ids, err)
	ids, err = k.rootfs.List(ctx)
	list("scratch", ids, err)
	ids, err = k.netns.List(ctx)
	list("netns", ids, err)
	ids, err = k.runtime.Known()
	list("runsc", ids, err)
	if k.links != nil {
		ids, err = k.links.List(ctx)
		list("link", ids, err)
		ids, err = k.firewall.List(ctx)
		list("nft", ids, err)
	}
	qs, err := k.rootfs.DiskProjects(ctx, k.diskProjects.Base, k.diskProjects.Base+k.diskProjects.Count)
	ids = nil
	for _, q := range qs {
		ids = append(ids, fmt.Sprint(q.ID))
	}
	list("disk project", ids, err)
	dirs := []struct{ what, dir string }{{"bundle", filepath.Join(k.runDir, "bundles")}, {"logs", k.runtime.LogRoot()},
		{"agent", filepath.Join(k.runDir, guest.AgentsDirName)}}
	if k.block != nil {
		ids, err = k.block.List(ctx)
		list("writer", ids, err)
		ids, err = k.blockMounts.List(ctx)
		list("blockmount", ids, err)
		dirs = append(dirs, struct{ what, dir string }{"writer dir", k.writersDir})
	}
	if k.volumeMounts != nil {
		ids, err = k.volumeMounts.List(ctx)
		list("volume mount", ids, err)
		if ents, _ := os.ReadDir(filepath.Join(k.writersDir, "vol")); len(ents) > 0 {
			for _, e := range ents {
				lines = append(lines, "volume writer dir "+e.Name())
			}
		}
	}
	for _, d := range dirs {
		ents, _ := os.ReadDir(d.dir)
		for _, e := range ents {
			if _, _, ok := names.ParseGeneration(e.Name()); ok {
				lines = append(lines, d.what+" "+e.Name())
			}
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// TestKernelCrashPoints crashes at every crash point once on the real
// kernel, as TestCrashPoints and TestCrashChains do on the fake one, in
// both RootFS modes (every point in at least one): each of a claim's points in a claim of its own, a
// teardown's points in turn in the recoveries of one release, the sweep's
// in those of one sweep (a guest costs seconds under TCG). Block mode's
// generations run real `ctld writer` processes on /dev/nbdX over a block
// store with the busybox template; their recoveries must stop the writer,
// free the device and unmount its root, as the proof and the leak check
// (no nbd device connected, no mount, no writer in its cgroup) say.
// Block mode runs the points of blockRootKinds; its other entries are
// overlay mode's code on the same objects, run there (each costs seconds
// under TCG: all 67 in block mode took 4.6 min in one VM run, these 25
// 1.2 min in another). The volumes entry's points run in block mode with
// a real persistent volume attached (block-volume): its writer, host
// mount, seal and publish.
func TestKernelCrashPoints(t *testing.T) {
	ktest.Require(t)
	start := time.Now()
	store := newRealBlockStore(t)
	modes := []struct {
		name string
		mode journal.RootFSMode
		// chains is a kernel of the mode for crashChains (it builds
		// nothing in the kernel).
		chains func() *testKernel
		make   func(t *testing.T) *testKernel
		// runs says which of the mode's points run in it.
		runs func(point string) bool
	}{
		{"overlay", journal.RootFSOverlay, realNet, realKernel, func(p string) bool { return !isVolumePoint(p) }},
		{"block", journal.RootFSBlock, func() *testKernel {
			k := realNet()
			k.block, k.blockMounts, k.blockMode = (*writer.Supervisor)(nil), (*rootfs.Block)(nil), true
			return k
		}, func(t *testing.T) *testKernel { return realBlockKernel(t, store) }, onBlockRoot},
		// The volumes entry's points on block roots with a real persistent
		// volume attached (a new one per case: each checks its heads).
		{"block-volume", journal.RootFSBlock, func() *testKernel {
			k := realNet()
			k.block, k.blockMounts, k.blockMode = (*writer.Supervisor)(nil), (*rootfs.Block)(nil), true
			k.sealer, k.pvolumes, k.volumeMounts, k.volumeFreezer = blockvol.Sealer{}, blockvol.Volumes{}, (*rootfs.Block)(nil), (*rootfs.Block)(nil)
			k.writersDir = "writers"
			return k
		}, func(t *testing.T) *testKernel { return realVolumeKernel(t, store) }, isVolumePoint},
	}
	done := map[string]map[string]bool{}
	for _, m := range modes {
		t0 := time.Now()
		done[m.name] = map[string]bool{}
		for _, point := range testCrashPoints() {
			if !isClaimPoint(point) || !pointApplies(point, m.mode) || !m.runs(point) {
				continue
			}
			done[m.name][point] = true
			t.Run(m.name+"/"+subtestName(point)+"/claim", func(t *testing.T) {
				k := m.make(t)
				k.noReuse = true // the fake kernel runs it; here it would double the time
				if !runCrashCase(t, k, crashCaseNamed("claim"), point, 1) {
					t.Errorf("a claim never passed crash point %s", point)
				}
			})
		}
		for _, c := range crashChains(m.chains()) {
			c.points = slices.DeleteFunc(c.points, func(p string) bool { return !m.runs(p) })
			if len(c.points) == 0 {
				continue
			}
			for _, p := range c.points {
				done[m.name][p] = true
			}
			t.Run(m.name+"/"+c.c.name+"-chain", func(t *testing.T) {
				k := m.make(t)
				k.noReuse = true
				runCrashChain(t, k, c.c, c.points)
			})
		}
		t.Logf("%s mode: %d crash points in %v", m.name, len(done[m.name]), time.Since(t0).Round(time.Second))
	}
	// A live update does not depend on the RootFS mode: overlay claims.
	for _, point := range network.UpdateCrashPoints() {
		done["overlay"][point] = true
		t.Run(subtestName(point)+"/update", func(t *testing.T) {
			k := realKernel(t)
			k.noReuse = true
			if !runCrashCase(t, k, crashCaseNamed("update"), point, 1) {
				t.Errorf("an update never passed crash point %s", point)
			}
		})
	}
	for _, m := range modes {
		var elsewhere []string
		for _, p := range testCrashPoints() {
			if pointApplies(p, m.mode) && !done[m.name][p] {
				elsewhere = append(elsewhere, p)
			}
		}
		t.Logf("%s mode: crash points %v run in another mode only (the same entries)", m.name, elsewhere)
	}
	for _, p := range testCrashPoints() {
		ran := false
		for _, m := range modes {
			ran = ran || done[m.name][p]
		}
		if !ran {
			t.Errorf("crash point %s is not run on the real kernel", p)
		}
	}
	t.Logf("crash points in all modes in %v", time.Since(start).Round(time.Second))
}

// realVolumeKernel is realBlockKernel whose claims attach a new
// persistent volume (16 MiB of ext4) of store at /data: the node's
// sealer, volumes and volume mounts (<state>/volmounts) as ctld's
// buildBlock makes them.
func realVolumeKernel(t *testing.T, store *realBlockStore) *testKernel {
	t.Helper()
	k := realBlockKernel(t, store)
	state := filepath.Dir(k.writersDir)
	id := "v" + randHex(4)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := template.CreateVolume(ctx, store.templates.repo, id, 16<<20, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	vm := &rootfs.Block{Dir: filepath.Join(state, "volmounts")}
	k.sealer = blockvol.Sealer{Supervisor: k.block.(*writer.Supervisor)}
	k.pvolumes = blockvol.Volumes{Repo: store.templates.repo, Kind: blockstore.KindVolume}
	k.volumeMounts, k.volumeFreezer = vm, vm
	k.volume = id
	return k
}

// blockRootKinds are the entries whose crash points the real kernel's
// crash test runs in block mode: block mode's own and those on its root
// (the bundle names it, the guest runs on it). The others (logs, cgroup,
// the network) are the same code on the same objects as in overlay mode.
var blockRootKinds = []journal.Kind{journal.KindWriter, journal.KindBlockMount, journal.KindBundle, journal.KindRunsc}

// onBlockRoot says whether point is one of blockRootKinds' (claim,
// teardown or orphan) or the proof's.
func onBlockRoot(point string) bool {
	kind, _, _ := strings.Cut(strings.TrimPrefix(point, "orphan:"), ":")
	return point == "proof:signed" || slices.Contains(blockRootKinds, journal.Kind(kind))
}

// TestKernelReconcileBranches: a generation whose guest was killed is
// lost and cleaned up; a claim whose readiness probe fails is rolled back
// at once; both with clean proofs and nothing left.
func TestKernelReconcileBranches(t *testing.T) {
	ktest.Require(t)
	t.Run("readopt", func(t *testing.T) {
		k := realKernel(t)
		r := newRig(t, k)
		r.mustBoot()
		resp := r.mustClaim(sb, claimReq("c1", 1))
		r.mustBoot()
		if s := r.sandbox(sb); s.State != journal.StateReady || s.ContainerID != resp.Sandbox.ContainerID {
			t.Fatalf("after takeover: %s %s (%s), want ready %s", s.State, s.ContainerID, s.Reason, resp.Sandbox.ContainerID)
		}
		execThenRelease(r)
	})
	t.Run("lost", func(t *testing.T) {
		k := realKernel(t)
		r := newRig(t, k)
		r.mustBoot()
		resp := r.mustClaim(sb, claimReq("c1", 1))
		k.killGuest(t, resp.Sandbox.ContainerID)
		r.mustBoot()
		if s := r.sandbox(sb); s.State != journal.StateReleased || s.Withheld || !strings.Contains(s.Reason, "lost") {
			t.Fatalf("after takeover: %s withheld=%v (%s), want released as lost", s.State, s.Withheld, s.Reason)
		}
		r.checkProof("lost-" + resp.Sandbox.ContainerID)
		r.checkClean("after the lost generation")
		checkUnjournaled(r, crashCase{})
	})
	t.Run("rollback", func(t *testing.T) {
		k := realKernel(t)
		k.noReuse = true
		if runCrashCase(t, k, crashCaseNamed("rollback"), "", 1) {
			t.Fatal("crashed without a crash point")
		}
	})
}

// runscBuild is bin's build, as ctld records it (make RUNSC=current|debian).
func runscBuild(bin string) string {
	v, _ := runsc.Version(context.Background(), bin)
	return v
}
