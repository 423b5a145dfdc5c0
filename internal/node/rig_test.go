package node

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/netpolicy"
	"github.com/ctld/ctld/internal/node/blockroot"
	"github.com/ctld/ctld/internal/node/fakekernel"
	"github.com/ctld/ctld/internal/node/guest"
	"github.com/ctld/ctld/internal/node/network"
	"github.com/ctld/ctld/internal/node/overlay"
	"github.com/ctld/ctld/internal/node/pvolume"
	"github.com/ctld/ctld/internal/node/warm"
	"github.com/ctld/ctld/internal/node/writers"
	"github.com/ctld/ctld/internal/proof"
	"github.com/ctld/ctld/internal/testutil"
)

// The crash and reconcile cases run on two kernels: the fake one (unit
// tests, milliseconds; crash_test.go) and the test VM's real one (kernel
// tests; crash_kernel_test.go). A rig is one node's life over one journal
// and one kernel: boot a term, run operations that may "crash" (the node's
// Crash hook ends the operation's goroutine at a named point: no more of
// that node's code runs, as when the process is killed), boot the next
// term over the same journal and kernel, and check what its Reconcile left.

// testKernel is what the cases need of a kernel.
type testKernel struct {
	leases  guest.Leases
	rootfs  overlay.RootFS
	netns   network.Netns
	runtime guest.Runtime
	// The agent socket dirs' tmpfs and peer check (nil: none).
	agentDirs  guest.AgentDirs
	agentPeers guest.AgentPeers
	// The sandbox network (nil: the node makes none).
	links    network.Links
	firewall network.Firewall
	flows    network.Flows
	pool     netpolicy.Pool
	// dns returns the DNS proxy of a new term (its registry is a
	// process's memory); nil: none.
	dns func() network.DNSProxy
	// nftTable is the name of the firewall's table (the real kernel's).
	nftTable string
	// enforced says which mode the kernel enforces for a generation's
	// chain (nil: not known to the test).
	enforced func(chain string) (netpolicy.Mode, bool)
	runDir   string
	// agentBinary is the node's ctl-agent (Config.AgentBinary).
	agentBinary string
	// templatesDir holds the template "busybox".
	templatesDir string
	diskProjects DiskProjects
	// text renders the generations' kernel objects and files, "" when
	// none is left.
	text func() string
	// killGuest kills a generation's guest (sandbox and gofer processes).
	killGuest func(t testing.TB, cid string)
	// failProbe makes the readiness probe of the claim req fail (after
	// every effect of the claim was made).
	failProbe func(t testing.TB, req *journal.ClaimRequest)
	// timeout bounds one operation.
	timeout time.Duration
	// carriers is the node's warm carrier pool size (Config.Carriers).
	carriers int
	// carrierWait is Config.CarrierWait (0: its default).
	carrierWait time.Duration
	// warm is Config.WarmPool (RefillEvery 0: 1 ms), warmRes
	// Config.WarmResources.
	warm    warm.Settings
	warmRes journal.Resources
	// noReuse leaves out the claim and release of a next generation after
	// each case (the VM, where each costs seconds).
	noReuse bool
	// showLog shows the node's log also when the test passes.
	showLog bool
	// resources, when set, replace every claim's (the VM's guests need
	// more CPU than a lease of 0.2 CPU to boot in seconds under TCG).
	resources *journal.Resources
	// bootCPU is Config.BootCPUMillis; runtimePIDs Config.RuntimePIDs.
	bootCPU, runtimePIDs int64
	// readyTimeout is Config.ReadyTimeout (0: its default).
	readyTimeout time.Duration
	// exitPoll is Config.ExitPoll; 0 here: no exit watch, so a guest a
	// test kills is found by the next takeover (exits_test.go sets it).
	exitPoll time.Duration
	// Block mode (nil: the node has none); blockMode makes every claim a
	// block-mode one (its disk lease the template's device size).
	block       writers.Devices
	blockMounts writers.Mounts
	templates   writers.Templates
	// volumes, sealer and freezer make block roots durable (nil: none).
	volumes writers.Volumes
	sealer  writers.Sealer
	freezer writers.Freezer
	// pvolumes, volumeMounts and volumeFreezer attach persistent volumes
	// (nil: none).
	pvolumes      writers.Volumes
	volumeMounts  writers.Mounts
	volumeFreezer writers.Freezer
	writersDir    string
	blockMode     bool
	// volume, when set, is a persistent volume every claim that names
	// none attaches at /data (the crash tests of the volumes entry).
	volume string
	// blockStore is the node's BlockConfig but WritersDir: the real
	// kernel's block store (StoreDir, NodeKeyFile, NodeKeyID,
	// DeadConnTimeout), the fake's writer checks (CheckEvery).
	blockStore BlockConfig
}

// warmSettings is the node's WarmPool: k.warm, refilled every 1 ms
// unless it says otherwise.
func (k *testKernel) warmSettings() warm.Settings {
	s := k.warm
	s.RefillEvery = cmp.Or(s.RefillEvery, time.Millisecond)
	return s
}

// mode is the RootFS mode of the kernel's claims.
func (k *testKernel) mode() journal.RootFSMode {
	if k.blockMode {
		return journal.RootFSBlock
	}
	return journal.RootFSOverlay
}

// blockConfig is the node's BlockConfig over k's writers dir and store.
func (k *testKernel) blockConfig() BlockConfig {
	c := k.blockStore
	c.WritersDir = k.writersDir
	if c.NodeKeyID == "" {
		c.NodeKeyID = "node"
	}
	return c
}

// pointApplies says whether a generation of mode passes point: not if
// the point is of an entry of the other RootFS mode.
func pointApplies(point string, mode journal.RootFSMode) bool {
	kind, _, _ := strings.Cut(strings.TrimPrefix(point, "orphan:"), ":")
	tab := newTable(&Node{})
	if tab.Kind(journal.Kind(kind)) == nil {
		return true
	}
	return slices.ContainsFunc(tab.For(journal.Sandbox{RootFS: journal.RootFS{Mode: mode}}), func(r entry) bool { return string(r.Spec().Kind) == kind })
}

// rig runs terms of a node over one journal and one kernel.
type rig struct {
	t     testing.TB
	k     *testKernel
	dir   string // state dir: journal and identity
	ident proof.Identity
	j     *journal.Journal
	epoch uint64
	n     *Node
	end   context.CancelFunc // ends n's term
	log   *slog.Logger
	logs  testutil.Buffer // every term's log, shown when the test fails

	// unjournaled collects Node.Unjournaled of the terms that ended.
	unjournaled []string

	// pause, when set, is called at every crash point first (a test
	// holds an operation there).
	pause func(point string)

	mu      sync.Mutex
	crashAt string          // the point where the next crash happens
	crashed string          // the point where the last crash happened
	reached map[string]bool // every point any term passed
}

func newRig(t testing.TB, k *testKernel) *rig {
	t.Helper()
	r := &rig{t: t, k: k, dir: fastTempDir(t), reached: map[string]bool{}}
	r.log = slog.New(slog.NewTextHandler(&r.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var err error
	if r.ident, err = proof.LoadOrCreateIdentity(r.dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() || r.k.showLog {
			t.Logf("node log:\n%s", r.logs.String())
		}
		if r.end != nil {
			r.end()
			r.n.Close()
		}
		if r.j != nil {
			r.j.Close()
		}
	})
	return r
}

// crash is the node's Crash hook.
func (r *rig) crash(point string) {
	if r.pause != nil {
		r.pause(point)
	}
	r.mu.Lock()
	r.reached[point] = true
	hit := point == r.crashAt
	if hit {
		r.crashAt, r.crashed = "", point
	}
	r.mu.Unlock()
	if hit {
		runtime.Goexit() // ends the operation's goroutine (see do)
	}
}

// arm makes the next pass through point crash.
func (r *rig) arm(point string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.crashAt, r.crashed = point, ""
}

// lastCrash returns the point of the crash since arm, or "".
func (r *rig) lastCrash() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.crashed
}

// do runs f in its own goroutine, which a crash ends; it reports whether f
// returned.
func (r *rig) do(f func()) (returned bool) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
		returned = true
	}()
	<-done
	return returned
}

// boot starts the next term, as a new process would: the previous term
// ends (its node runs no more code), the journal is reopened and taken
// over with the next epoch, and a new node reconciles. It reports whether
// Reconcile returned (false: it crashed) and its error.
func (r *rig) boot() (returned bool, err error) {
	r.t.Helper()
	if r.end != nil {
		r.end()
		r.n.Close()
		r.unjournaled = append(r.unjournaled, r.n.Unjournaled()...)
	}
	if r.j != nil {
		if err := r.j.Close(); err != nil {
			r.t.Fatalf("close journal: %v", err)
		}
	}
	j, err := journal.Open(filepath.Join(r.dir, "journal.db"), 5*time.Second)
	if err != nil {
		r.t.Fatal(err)
	}
	r.epoch++
	if err := j.TakeOver(r.epoch); err != nil {
		r.t.Fatal(err)
	}
	term, end := context.WithCancel(context.Background())
	r.j, r.end = j, end
	var dns network.DNSProxy
	if r.k.dns != nil {
		dns = r.k.dns()
	}
	r.n = New(Config{
		Slot: "a", StateDir: r.dir, RunDir: r.k.runDir, TemplatesDir: r.k.templatesDir,
		DefaultDiskBytes: 16 << 20, DiskProjects: r.k.diskProjects, Carriers: r.k.carriers, CarrierWait: r.k.carrierWait,
		Block:       r.k.blockConfig(),
		AgentBinary: r.k.agentBinary, BootCPUMillis: r.k.bootCPU, RuntimePIDs: r.k.runtimePIDs, ReadyTimeout: r.k.readyTimeout,
		ExitPoll: cmp.Or(r.k.exitPoll, -1),
		WarmPool: r.k.warmSettings(), WarmResources: r.k.warmRes, Versions: Versions{Runsc: "test-runsc"},
	}, Deps{
		Guest:   guest.Deps{Leases: r.k.leases, Runtime: r.k.runtime, AgentDirs: r.k.agentDirs, AgentPeers: r.k.agentPeers},
		Overlay: overlay.Deps{RootFS: r.k.rootfs},
		Network: network.Deps{
			Netns: r.k.netns, Links: r.k.links, Firewall: r.k.firewall, Flows: r.k.flows, DNSProxy: dns, Pool: r.k.pool,
			NodeAddrs: testNodeAddrs,
		},
		Writers: writers.Deps{Devices: r.k.block, Sealer: r.k.sealer},
		Block:   blockroot.Deps{Mounts: r.k.blockMounts, Templates: r.k.templates, Volumes: r.k.volumes, Freezer: r.k.freezer},
		Volumes: pvolume.Deps{Store: r.k.pvolumes, Mounts: r.k.volumeMounts, Freezer: r.k.volumeFreezer},
		Journal: j, Answers: testAnswers{}, Identity: r.ident, Epoch: r.epoch,
		Total: testTotal, Term: term, Crash: r.crash, Logger: r.log,
	})
	ctx, cancel := context.WithTimeout(context.Background(), r.k.timeout)
	defer cancel()
	defer r.took(fmt.Sprintf("boot epoch %d", r.epoch), time.Now())
	returned = r.do(func() { err = r.n.Reconcile(ctx) })
	return returned, err
}

// mustBoot boots a term whose Reconcile must return without error.
func (r *rig) mustBoot() {
	r.t.Helper()
	if returned, err := r.boot(); !returned || err != nil {
		r.t.Fatalf("boot epoch %d: returned %v (crash at %q), err %v", r.epoch, returned, r.lastCrash(), err)
	}
}

// recover boots terms until one reconciles without crashing; the first
// reboot crashes again if it passes the point (recovery interrupted too).
func (r *rig) recover(point string, crashes int) {
	r.t.Helper()
	for i := 1; ; i++ {
		if i < crashes {
			r.arm(point)
		} else {
			r.arm("")
		}
		returned, err := r.boot()
		r.arm("") // a recovery that did not pass the point must not crash later
		if !returned {
			if i >= crashes {
				r.t.Fatalf("boot %d crashed at %q although unarmed", i, r.lastCrash())
			}
			continue
		}
		if err != nil {
			r.t.Fatalf("reconcile (epoch %d) after the crash at %s: %v", r.epoch, point, err)
		}
		return
	}
}

// fastTempDir is a temp dir on tmpfs when there is one: the journal
// fsyncs every transaction, which costs milliseconds each on a disk.
func fastTempDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("/dev/shm", "ctld-node-test-")
	if err != nil {
		return t.TempDir()
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// testPool is the fake kernel's address pool: small, so exhaustion is
// cheap to test.
var testPool = netpolicy.Pool{V4: netip.MustParsePrefix("10.200.0.0/28"), V6: netip.MustParsePrefix("fd00:c71d::/120")}

var testNodeAddrs = []netip.Addr{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("2001:db8::10")}

var testTotal = Capacity{CPUMillis: 4000, MemoryBytes: 8 << 30, PIDs: 10000, DiskBytes: 10 << 30}

func (r *rig) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), r.k.timeout)
}

func claimReq(op string, gen uint64) journal.ClaimRequest {
	return journal.ClaimRequest{
		OperationID: op, Generation: gen,
		RootFS:    journal.RootFS{Mode: "overlay", Template: "busybox"},
		Resources: journal.Resources{CPUMillis: 200, MemoryBytes: 128 << 20, PIDs: 128, DiskBytes: 16 << 20},
	}
}

func (r *rig) claim(id string, req journal.ClaimRequest) (resp answer, err error, returned bool) {
	ctx, cancel := r.ctx()
	defer cancel()
	defer r.took("claim "+req.OperationID, time.Now())
	if r.k.resources != nil {
		req.Resources = *r.k.resources
	}
	if r.k.blockMode {
		req.RootFS.Mode, req.Resources.DiskBytes = journal.RootFSBlock, 0
	}
	if r.k.volume != "" && len(req.Volumes) == 0 {
		req.Volumes = []journal.VolumeMount{{ID: r.k.volume, Path: "/data"}}
	}
	returned = r.do(func() { resp, err = decodeAnswer(r.n.Claim(ctx, id, req)) })
	return resp, err, returned
}

// took logs how long a step took (the VM's numbers are the ones that
// matter).
func (r *rig) took(what string, start time.Time) {
	r.log.Info("test step", "step", what, "ms", time.Since(start).Milliseconds())
}

func (r *rig) release(id, op string, gen uint64) (resp answer, err error, returned bool) {
	ctx, cancel := r.ctx()
	defer cancel()
	defer r.took("release "+op, time.Now())
	returned = r.do(func() {
		resp, err = decodeAnswer(r.n.Release(ctx, id, ReleaseRequest{OperationID: op, Generation: gen}))
	})
	return resp, err, returned
}

func (r *rig) mustClaim(id string, req journal.ClaimRequest) answer {
	r.t.Helper()
	resp, err, returned := r.claim(id, req)
	if !returned || err != nil {
		r.t.Fatalf("claim %s %s: returned %v (crash at %q), %v", id, req.OperationID, returned, r.lastCrash(), err)
	}
	return resp
}

func (r *rig) mustRelease(id, op string, gen uint64) answer {
	r.t.Helper()
	resp, err, returned := r.release(id, op, gen)
	if !returned || err != nil {
		r.t.Fatalf("release %s %s: returned %v (crash at %q), %v", id, op, returned, r.lastCrash(), err)
	}
	return resp
}

func (r *rig) sandbox(id string) journal.Sandbox {
	r.t.Helper()
	s, err := r.n.sandbox(id)
	if err != nil {
		r.t.Fatal(err)
	}
	return s
}

// checkProof: the proof of op is journaled, clean and signed by the node.
func (r *rig) checkProof(op string) proof.Proof {
	r.t.Helper()
	p, err := r.n.Proof(context.Background(), op)
	if err != nil {
		r.t.Fatalf("proof of %s: %v", op, err)
	}
	if !p.Clean {
		r.t.Errorf("proof of %s is not clean: %s", op, failedChecks(p))
	}
	if err := proof.Verify(p, r.ident.PublicKey()); err != nil {
		r.t.Errorf("proof of %s: %v", op, err)
	}
	return p
}

// checkClean: nothing of any generation is left in the kernel, the ledger
// holds no capacity, the journal no effect and no pending operation.
func (r *rig) checkClean(when string) {
	r.t.Helper()
	if got := r.k.text(); got != "" {
		r.t.Errorf("%s: the kernel still has:\n%s", when, got)
	}
	nd, err := r.n.Node(context.Background())
	if err != nil {
		r.t.Fatal(err)
	}
	if nd.Capacity.Leased != (Capacity{}) || nd.Capacity.Withheld != (Capacity{}) || len(nd.Withheld) > 0 {
		r.t.Errorf("%s: capacity not returned: leased %+v, withheld %+v %+v", when, nd.Capacity.Leased, nd.Capacity.Withheld, nd.Withheld)
	}
	err = r.j.View(func(tx *journal.Tx) error {
		es, err := tx.Effects()
		for _, e := range es {
			r.t.Errorf("%s: effect record left: %s %s %s (epoch %d)", when, e.Kind, e.Name, e.State, e.Epoch)
		}
		if err != nil {
			return err
		}
		ops, err := tx.PendingOperations()
		for _, o := range ops {
			if o.State == journal.OpPending {
				r.t.Errorf("%s: operation %s (%s) still pending", when, o.ID, o.Kind)
			}
		}
		return err
	})
	if err != nil {
		r.t.Fatal(err)
	}
}

// allUnjournaled lists the objects any term of the rig found and removed
// although no effect record named them.
func (r *rig) allUnjournaled() []string {
	out := slices.Clone(r.unjournaled)
	if r.n != nil {
		out = append(out, r.n.Unjournaled()...)
	}
	return out
}

// effects returns the journal's effect records by "kind/name".
func (r *rig) effects() map[string]journal.Effect {
	r.t.Helper()
	out := map[string]journal.Effect{}
	err := r.j.View(func(tx *journal.Tx) error {
		es, err := tx.Effects()
		for _, e := range es {
			out[string(e.Kind)+"/"+e.Name] = e
		}
		return err
	})
	if err != nil {
		r.t.Fatal(err)
	}
	return out
}

// claimKinds are the table's kinds, in claim order.
func claimKinds() []journal.Kind {
	var out []journal.Kind
	for _, r := range newTable(&Node{}).All() {
		out = append(out, r.Spec().Kind)
	}
	return out
}

// testCrashPoints lists every crash point of the node.
func testCrashPoints() []string { return CrashPoints() }

// checkJournalAt asserts what the journal says at a crash point: the
// effect record that point is about, in the state it must be in then.
// Recovery is driven by these records, so an effect() that stopped
// writing them fails here even if the name sweep hid it.
func (r *rig) checkJournalAt(point, cid string) {
	r.t.Helper()
	k, step, ok := strings.Cut(point, ":")
	kind := journal.Kind(k)
	if !ok || !slices.Contains(claimKinds(), kind) {
		return
	}
	want := map[string]journal.EffectState{"intended": journal.Intended, "made": journal.Intended, "done": journal.Done,
		"removing": journal.Removing, "removed": journal.Removing}[step]
	if want == "" {
		return
	}
	e, ok := r.effects()[k+"/"+cid]
	switch {
	case !ok:
		r.t.Errorf("crashed at %s: the journal has no effect record %s/%s", point, kind, cid)
	case e.State != want || e.Generation == 0 || e.SandboxID == "":
		r.t.Errorf("crashed at %s: effect record %+v, want state %s with its sandbox and generation", point, e, want)
	}
}

// A crashCase is one operation that can pass crash points, and what must
// hold once a later term recovered from a crash in it.
type crashCase struct {
	name string
	// covers says which points this case is the one to run on (the VM
	// runs each point once, in its case).
	covers func(point string) bool
	// setup runs unarmed.
	setup func(r *rig)
	// run runs armed; it reports whether it returned (false: crashed).
	run func(r *rig) bool
	// check runs after the recovery (and after a run that did not crash).
	check func(r *rig, crashed bool)
	// orphan says which objects ("kind/name") the case's recovery may find
	// without an effect record naming them; nil: none, the journal must
	// have named everything recovery removed.
	orphan func(object string) bool
}

const sb = "sb"

// updatePolicy is what the update crash case switches a deny_all
// generation to.
var updatePolicy = journal.NetworkPolicy{Mode: "restricted", Rules: []journal.NetworkRule{{CIDR: "203.0.113.0/24", Protocol: "tcp", Ports: []string{"443"}}}}

func isClaimPoint(p string) bool {
	if isUpdatePoint(p) {
		return false
	}
	_, step, _ := strings.Cut(p, ":")
	return step == "intended" || step == "made" || step == "done"
}

func isTeardownPoint(p string) bool {
	kind, step, _ := strings.Cut(p, ":")
	if step == "removing" || step == "removed" || p == "proof:signed" {
		return true
	}
	e := newTable(&Node{}).Kind(journal.Kind(kind))
	return e != nil && slices.Contains(e.Spec().RemovePoints, p)
}

// isVolumePoint is a point of the volumes entry: passed only by a
// generation with a persistent volume (testKernel.volume).
func isVolumePoint(p string) bool {
	kind, _, _ := strings.Cut(strings.TrimPrefix(p, "orphan:"), ":")
	return journal.Kind(kind) == journal.KindVolumes
}

// volumeHead is the head of the kernel's test volume.
func (r *rig) volumeHead() journal.VolumeHead {
	r.t.Helper()
	h, err := r.k.pvolumes.Head(context.Background(), r.k.volume)
	if err != nil {
		r.t.Fatalf("head of volume %s: %v", r.k.volume, err)
	}
	return h
}

func isOrphanPoint(p string) bool { return strings.HasPrefix(p, "orphan:") }

func isUpdatePoint(p string) bool { return slices.Contains(network.UpdateCrashPoints(), p) }

// isSweepPoint is an orphan point the name sweep passes too on a node
// over k: of a kind whose objects k lists (the others are reached only by
// finishing effect records). A nil k is the fake kernel, which has them all.
func isSweepPoint(k *testKernel, p string) bool {
	kind, ok := strings.CutPrefix(p, "orphan:")
	if !ok {
		return false
	}
	var d Deps
	var cfg Config
	if k != nil {
		d = Deps{
			Guest: guest.Deps{Leases: k.leases, Runtime: k.runtime}, Overlay: overlay.Deps{RootFS: k.rootfs},
			Network: network.Deps{Netns: k.netns, Links: k.links, Firewall: k.firewall, Flows: k.flows, Pool: k.pool},
			Writers: writers.Deps{Devices: k.block, Sealer: k.sealer},
			Block:   blockroot.Deps{Mounts: k.blockMounts, Templates: k.templates},
			Volumes: pvolume.Deps{Store: k.pvolumes, Mounts: k.volumeMounts, Freezer: k.volumeFreezer},
		}
		cfg.Block.WritersDir = k.writersDir
	} else {
		d = Deps{
			Guest:   guest.Deps{Leases: (*fakekernel.Leases)(nil), Runtime: (*fakekernel.Runtime)(nil)},
			Overlay: overlay.Deps{RootFS: (*fakekernel.RootFS)(nil)},
			Network: network.Deps{Netns: (*fakekernel.Netns)(nil), Links: (*fakekernel.Links)(nil), Firewall: (*fakekernel.Firewall)(nil), Pool: testPool},
			Writers: writers.Deps{Devices: (*fakekernel.Blocks)(nil), Sealer: (*fakekernel.Sealer)(nil)},
			Block:   blockroot.Deps{Mounts: (*fakekernel.BlockMounts)(nil), Templates: (*fakekernel.Templates)(nil)},
			Volumes: pvolume.Deps{Store: (*fakekernel.PVolumes)(nil), Mounts: (*fakekernel.VolumeMounts)(nil), Freezer: (*fakekernel.VolumeMounts)(nil)},
		}
		cfg.Block.WritersDir = "writers"
	}
	n := New(cfg, d)
	r := n.table.Kind(journal.Kind(kind))
	return r != nil && r.Spec().Sweeps
}

// claimFailed: the claim c1 of sb was rolled back (failed, clean proof
// under its operation id) and a retry of c1 gets the same stored error.
func claimFailed(r *rig, req journal.ClaimRequest, wantCode errdefs.Code) {
	r.t.Helper()
	if s := r.sandbox(sb); s.State != journal.StateFailed || s.Withheld {
		r.t.Errorf("sandbox %s is %s (withheld %v, %s), want failed", sb, s.State, s.Withheld, s.Reason)
	}
	r.checkProof("c1")
	_, err1, _ := r.claim(sb, req)
	_, err2, _ := r.claim(sb, req)
	if err1 == nil || errdefs.CodeOf(err1) != wantCode || err1.Error() != err2.Error() {
		r.t.Errorf("retry of claim c1: %v, then %v; want the same stored %s error", err1, err2, wantCode)
	}
}

// reuse: capacity and names are free again: the next generation claims
// and releases cleanly.
func reuse(r *rig, gen uint64) {
	r.t.Helper()
	if r.k.noReuse {
		return
	}
	op := fmt.Sprintf("c%d", gen)
	r.mustClaim(sb, claimReq(op, gen))
	rop := fmt.Sprintf("r%d", gen)
	r.mustRelease(sb, rop, gen)
	r.checkProof(rop)
	r.checkClean("after claiming and releasing generation " + fmt.Sprint(gen))
}

var crashCases = []crashCase{
	{
		// A claim cut short is rolled back by the next term.
		name: "claim", covers: isClaimPoint,
		run: func(r *rig) bool {
			_, err, returned := r.claim(sb, claimReq("c1", 1))
			if returned && err != nil {
				r.t.Fatalf("claim c1: %v", err)
			}
			return returned
		},
		check: func(r *rig, crashed bool) {
			if !crashed {
				r.mustRelease(sb, "r1", 1)
			} else {
				claimFailed(r, claimReq("c1", 1), errdefs.CodeUnavailable)
			}
			if r.k.volume != "" {
				// The release, or the rollback of an attach whose writer
				// ran, published the volume's next head once; nothing else.
				if h := r.volumeHead(); h.Seq > 2 || !crashed && h.Seq != 2 {
					r.t.Errorf("volume head %+v after the claim (crashed %v): want head 2, or 1 for a rollback", h, crashed)
				}
			}
			r.checkClean("after the claim")
			reuse(r, 2)
		},
	},
	{
		// A release cut short is completed by the next term, and its
		// operation answers with the stored proof.
		name: "release", covers: isTeardownPoint,
		setup: func(r *rig) { r.mustClaim(sb, claimReq("c1", 1)) },
		run: func(r *rig) bool {
			_, err, returned := r.release(sb, "r1", 1)
			if returned && err != nil {
				r.t.Fatalf("release r1: %v", err)
			}
			return returned
		},
		check: func(r *rig, crashed bool) {
			if s := r.sandbox(sb); s.State != journal.StateReleased || s.Withheld {
				r.t.Errorf("sandbox %s is %s (withheld %v, %s), want released", sb, s.State, s.Withheld, s.Reason)
			}
			p := r.checkProof("r1")
			if r.k.volume != "" {
				// Published once, whole: the attach's head 1, then the
				// release's seal as head 2 (a seal cut short before its
				// publish is sealed again, never published half).
				av := r.sandbox(sb).Volumes
				if h := r.volumeHead(); h.Seq != 2 || len(av) != 1 || av[0].Published == nil || av[0].Published.Seq != 2 || av[0].Published.Generation != h.Generation {
					r.t.Errorf("volume head %+v, journaled attach %+v: want head 2, the release's publish", h, av)
				}
			}
			for range 2 {
				resp, err, _ := r.release(sb, "r1", 1)
				if err != nil || !reflect.DeepEqual(resp.Proof, p) || resp.Sandbox.State != journal.StateReleased {
					r.t.Errorf("retry of release r1: %+v, %v; want the stored answer with proof %+v", resp, err, p)
				}
			}
			r.checkClean("after the release")
			reuse(r, 2)
		},
	},
	{
		// A live network update cut short is done by the next term: the
		// generation stays ready with the new policy in the kernel and
		// the journal.
		name: "update", covers: isUpdatePoint,
		setup: func(r *rig) { r.mustClaim(sb, claimReq("c1", 1)) },
		run: func(r *rig) bool {
			ctx, cancel := r.ctx()
			defer cancel()
			var err error
			returned := r.do(func() { _, err = r.n.UpdateNetwork(ctx, sb, updatePolicy) })
			if returned && err != nil {
				r.t.Fatalf("network update: %v", err)
			}
			return returned
		},
		check: func(r *rig, crashed bool) {
			s := r.sandbox(sb)
			if s.State != journal.StateReady || s.NetworkUpdate != nil || s.Network == nil || s.Network.Mode != journal.NetworkMode(updatePolicy.Mode) {
				r.t.Errorf("after the update: %s, network %+v, update %+v; want ready with mode %s done", s.State, s.Network, s.NetworkUpdate, updatePolicy.Mode)
			}
			if got, err := r.n.Get(context.Background(), sb); err != nil || got.Network == nil || string(got.Network.Mode) != string(updatePolicy.Mode) {
				r.t.Errorf("get after the update: %+v, %v", got.Network, err)
			}
			if r.k.enforced != nil {
				if mode, ok := r.k.enforced(netpolicy.ChainName(sb, 1)); !ok || string(mode) != string(updatePolicy.Mode) {
					r.t.Errorf("the kernel enforces %q (chain there: %v), want %s", mode, ok, updatePolicy.Mode)
				}
			}
			r.mustRelease(sb, "r1", 1)
			r.checkClean("after the update and release")
			reuse(r, 2)
		},
	},
	{
		// A claim whose readiness probe fails is rolled back at once; a
		// crash during that rollback leaves it to the next term.
		name: "rollback", covers: func(string) bool { return false },
		run: func(r *rig) bool {
			req := claimReq("c1", 1)
			r.k.failProbe(r.t, &req)
			_, err, returned := r.claim(sb, req)
			if returned && err == nil {
				r.t.Fatal("claim c1 with a failing readiness probe succeeded")
			}
			return returned
		},
		check: func(r *rig, crashed bool) {
			code := errdefs.CodeUnavailable // interrupted: the next term rolled it back
			if !crashed {
				code = errdefs.CodeInternal // the probe's own error
			}
			req := claimReq("c1", 1)
			r.k.failProbe(r.t, &req)
			claimFailed(r, req, code)
			r.checkClean("after the rollback")
			reuse(r, 2)
		},
	},
	{
		// Objects under ctld's names that this journal never recorded
		// (made by another node's journal) are orphans: the next term's
		// sweep removes them, also after a crash in the sweep.
		name: "orphan", covers: func(p string) bool { return isSweepPoint(nil, p) },
		setup: func(r *rig) {
			other := newRig(r.t, r.k)
			other.mustBoot()
			other.mustClaim("orph", claimReq("o1", 1))
			other.end()
			other.n.Close()
		},
		run: func(r *rig) bool {
			returned, err := r.boot()
			if returned && err != nil {
				r.t.Fatalf("reconcile: %v", err)
			}
			return returned
		},
		// The other node's objects; its disk project is named by number,
		// its link by its slot, its nft objects by its chain.
		orphan: func(o string) bool {
			kind, name, _ := strings.Cut(o, "/")
			_, err := strconv.ParseUint(name, 10, 32)
			_, link := netpolicy.ParseLinkName(name)
			switch journal.Kind(kind) {
			case journal.KindDisk:
				return err == nil
			case journal.KindLinks:
				return link
			case journal.KindNft:
				return name == netpolicy.ChainName("orph", 1)
			case journal.KindWriter:
				return filepath.Base(name) == containerID("orph", 1)
			}
			return name == containerID("orph", 1)
		},
		check: func(r *rig, crashed bool) {
			if _, err := r.n.sandbox("orph"); errdefs.CodeOf(err) != errdefs.CodeNotFound {
				r.t.Errorf("the orphan's sandbox is in this journal: %v", err)
			}
			r.checkClean("after the orphan sweep")
		},
	},
	{
		// Effect records of a generation that is over (its sandbox record
		// failed, e.g. restored from an older journal) are finished by the
		// next term: their objects removed, the records dropped, also
		// after a crash in the middle. Nothing is found by name only. The
		// one case that passes the orphan points of kinds the sweep does
		// not list.
		name: "over", covers: func(p string) bool { return isOrphanPoint(p) && !isSweepPoint(nil, p) },
		setup: func(r *rig) {
			r.mustClaim(sb, claimReq("c1", 1))
			err := r.j.Update(func(tx *journal.Tx) error {
				s, _, err := tx.Sandbox(sb)
				if err != nil {
					return err
				}
				s.State, s.Reason = journal.StateFailed, "test: over, effects left"
				return tx.PutSandbox(s)
			})
			if err != nil {
				r.t.Fatal(err)
			}
		},
		run: func(r *rig) bool {
			returned, err := r.boot()
			if returned && err != nil {
				r.t.Fatalf("reconcile: %v", err)
			}
			return returned
		},
		check: func(r *rig, crashed bool) {
			r.checkClean("after finishing the effects of a generation that is over")
			reuse(r, 2)
		},
	},
}

// subtestName is a crash point as a subtest name: no ':', which the
// kernel tests' dirs (named after the test) cannot carry into overlay
// options.
func subtestName(point string) string { return strings.ReplaceAll(point, ":", "-") }

func crashCaseNamed(name string) crashCase {
	for _, c := range crashCases {
		if c.name == name {
			return c
		}
	}
	panic("no crash case " + name)
}

// runCrashCase runs c with a crash at point (crashes times in a row:
// the recovery itself may crash at the same point once more). It reports
// whether the point was reached.
func runCrashCase(t *testing.T, k *testKernel, c crashCase, point string, crashes int) bool {
	r := newRig(t, k)
	r.mustBoot()
	if c.setup != nil {
		c.setup(r)
	}
	r.arm(point)
	returned := c.run(r)
	if returned {
		if r.lastCrash() != "" {
			t.Fatalf("returned although it crashed at %s", r.lastCrash())
		}
		// Not reached in this case: undo it, so the kernel is clean for
		// the next case.
		r.arm("")
		c.check(r, false)
		checkUnjournaled(r, c)
		return false
	}
	if got := r.lastCrash(); got != point {
		t.Fatalf("crashed at %q, armed %q", got, point)
	}
	r.checkJournalAt(point, containerID(sb, 1))
	r.recover(point, crashes)
	c.check(r, true)
	checkUnjournaled(r, c)
	return true
}

// crashChains are the chained runs on k: the teardown's points in a
// release, the sweep's in an orphan sweep, the other orphan points in
// finishing the effect records of a generation that is over.
func crashChains(k *testKernel) []struct {
	c      crashCase
	points []string
} {
	var release, orphan, over []string
	for _, p := range testCrashPoints() {
		if !pointApplies(p, k.mode()) {
			continue
		}
		switch {
		case isTeardownPoint(p):
			release = append(release, p)
		case isSweepPoint(k, p):
			orphan = append(orphan, p)
		case isOrphanPoint(p):
			over = append(over, p)
		}
	}
	return []struct {
		c      crashCase
		points []string
	}{{crashCaseNamed("release"), release}, {crashCaseNamed("orphan"), orphan}, {crashCaseNamed("over"), over}}
}

// runCrashChain runs c crashing at points[0], then boots a term that
// crashes at each next point in turn during the recovery, then one that
// recovers. Each point is crashed at once, for one claim: how the VM
// covers a teardown's or a sweep's points in the time of a few guests.
func runCrashChain(t *testing.T, k *testKernel, c crashCase, points []string) {
	r := newRig(t, k)
	r.mustBoot()
	if c.setup != nil {
		c.setup(r)
	}
	cid := containerID(sb, 1)
	r.arm(points[0])
	if c.run(r) {
		t.Fatalf("case %s did not pass crash point %s", c.name, points[0])
	}
	r.checkJournalAt(points[0], cid)
	for _, p := range points[1:] {
		r.arm(p)
		returned, err := r.boot()
		if returned {
			t.Fatalf("the recovery after the crash at %s did not pass crash point %s (reconcile: %v)", r.lastCrash(), p, err)
		}
		if got := r.lastCrash(); got != p {
			t.Fatalf("crashed at %q, armed %q", got, p)
		}
		r.checkJournalAt(p, cid)
	}
	r.arm("")
	r.mustBoot()
	c.check(r, true)
	checkUnjournaled(r, c)
}

// checkUnjournaled: recovery removed only what the journal named (the
// name sweep, the second line of defence, found nothing else), apart from
// the case's orphans. An effect() that stopped journaling fails here.
func checkUnjournaled(r *rig, c crashCase) {
	r.t.Helper()
	for _, o := range r.allUnjournaled() {
		if c.orphan == nil || !c.orphan(o) {
			r.t.Errorf("recovery found and removed %s, which no effect record named", o)
		}
	}
}

func fmtProject(p uint32) string { return strconv.FormatUint(uint64(p), 10) }
