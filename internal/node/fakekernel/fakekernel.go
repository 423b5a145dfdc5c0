// Package fakekernel is an in-memory kernel for the node's unit tests:
// cgroup leases, overlay mounts (each with a superblock), named network
// namespaces (each with an inode identity), runsc containers (their state
// files and whether their processes live), disk projects, and the sandbox
// network (veth pairs, ctld's nft table, conntrack flows, the DNS proxy's
// registry; network.go). It implements node.Leases, node.RootFS,
// node.Netns, node.Runtime, node.Links, node.Firewall, node.Flows and
// node.DNSProxy with
// the idempotency and error behaviour of the real subsystems (lease,
// rootfs, netpolicy, runsc: read their doc comments), so tests can walk
// every crash point and reconcile branch in milliseconds.
//
// What the node writes on the filesystem (bundles under RunDir, log
// directories under LogRoot, scratch dirs and mount roots) is real, under
// one temp dir. String renders the whole state, kernel objects and those
// files, as sorted lines: a test asserts k.String() == "" after a
// cleanup, and a failure shows what was left.
//
// Failures are injected: Refuse makes an object refuse removal (its
// generation's proof then fails: withheld), FailMake makes a step of a
// claim fail, KillGuest kills a guest (its generation is lost).
//
// The fake is a stand-in beside the VM kernel tests, never instead of
// them: what the kernel really does is proven there.
package fakekernel

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/ctld/ctld/internal/journal"
	"io"
	"io/fs"
	"iter"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/ctld/ctld/internal/diskquota"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/lease"
	"github.com/ctld/ctld/internal/names"
	"github.com/ctld/ctld/internal/netpolicy"
	"github.com/ctld/ctld/internal/rootfs"
	"github.com/ctld/ctld/internal/runsc"
)

// Refuse and FailMake name objects by the journal's effect kinds
// (journal.KindCgroup, ...): a disk by the container id for FailMake and
// by the project number for Refuse, conntrack by the slot number (Refuse
// only). KindExec is the fake's own, for FailMake only: every exec in that
// container fails.
const KindExec journal.Kind = "exec"

// cgroupParent is the lease parent under the fake cgroup root, as the real
// Manager's default.
const cgroupParent = "ctld.slice"

// nsfsDev is the device of every fake namespace file (nsfs has one).
const nsfsDev = 4

// Kernel is the fake. Its zero value is not usable: call New.
type Kernel struct {
	root string

	mu          sync.Mutex
	next        uint64
	cgroups     map[string]bool    // lease id → exists
	oomKills    map[string]int64   // lease id → memory.events oom_kill (exits.go)
	held        map[string]bool    // lease id → a test's process is in it (Populate)
	cpuMax      map[string][]int64 // lease id → cpu.max in millis, each value it had
	mounts      map[string]*mount
	superblocks map[string]*superblock // dev → superblock, while alive
	netns       map[string]uint64      // name → namespace inode
	namespaces  map[uint64]*namespace  // inode → namespace, while alive
	containers  map[string]*container
	projects    map[uint32]*project
	links       map[string]*link    // host end name → pair
	table       bool                // ctld's nft table exists
	chains      map[string]*fwChain // chain name → generation's nft objects
	fwd         map[string]string   // dispatch: link name → chain name
	flows       map[netpolicy.Slot][]Flow
	dns         map[netpolicy.Slot]dnsEntry // the DNS proxy's registry (one process's memory)
	forwarding  bool
	writers     map[string]*blockWriter // writer dir → writer (block.go)
	nbd         map[int]string          // connected /dev/nbdX → writer dir
	bmounts     map[string]*blockMount  // container id → block root mount
	vmounts     map[string]*blockMount  // volume id → persistent volume mount
	vols        map[string]*fakeVolume  // sandbox id → its volume (volumes.go)
	frozen      map[string]bool         // container ids whose block root is frozen
	refuse      map[string]error
	failMake    map[string]error
	unbounded   error
	calls       []string
	// claimHold, while set, holds warm agents' claim answers (HoldClaims).
	claimHold chan struct{}
	claimHeld chan string
}

type mount struct {
	id, lower, dev string
}

type superblock struct {
	dev, id string // id: the sandbox whose overlay it is
}

type namespace struct {
	ino  uint64
	name string // the name it was made under
}

type container struct {
	id, bundle, status string // status: created, running, stopped
	cgroup             string
	dev                string     // superblock of its root
	ns                 uint64     // its network namespace
	agent              *fakeAgent // its init's agent, once started (agent.go)
}

func (c *container) alive() bool { return c.status == "created" || c.status == "running" }

type project struct {
	id                    uint32
	dir                   string // sandbox id whose scratch dir carries it
	limitBytes, inodes    uint64
	usedBytes, usedInodes uint64 // extra usage a test added (see Charge)
}

// New returns an empty kernel whose files live under dir (a test's
// TempDir). It makes dir/templates/busybox, a template for claims (with
// /bin and /tmp).
func New(dir string) (*Kernel, error) {
	k := &Kernel{
		root: dir, next: 100,
		cgroups: map[string]bool{}, held: map[string]bool{}, cpuMax: map[string][]int64{}, mounts: map[string]*mount{}, superblocks: map[string]*superblock{},
		netns: map[string]uint64{}, namespaces: map[uint64]*namespace{}, containers: map[string]*container{},
		projects: map[uint32]*project{}, refuse: map[string]error{}, failMake: map[string]error{},
		links: map[string]*link{}, chains: map[string]*fwChain{}, fwd: map[string]string{},
		flows: map[netpolicy.Slot][]Flow{}, dns: map[netpolicy.Slot]dnsEntry{},
		writers: map[string]*blockWriter{}, nbd: map[int]string{}, bmounts: map[string]*blockMount{}, vmounts: map[string]*blockMount{},
	}
	for _, d := range []string{k.RunDir(), k.LogRoot(), k.scratch(), filepath.Join(k.TemplatesDir(), "busybox", "bin"), filepath.Join(k.TemplatesDir(), "busybox", "tmp")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	// A stand-in: the fake guest's agent is in-process (agent.go).
	if err := os.WriteFile(k.AgentBinary(), []byte("#!fake ctl-agent\n"), 0o755); err != nil {
		return nil, err
	}
	return k, nil
}

// AgentBinary is the node's ctl-agent for the fake (a stand-in file).
func (k *Kernel) AgentBinary() string { return filepath.Join(k.RunDir(), "ctl-agent") }

// RunDir is the node's run dir (its bundles go to RunDir/bundles).
func (k *Kernel) RunDir() string { return filepath.Join(k.root, "run") }

// TemplatesDir holds the template "busybox".
func (k *Kernel) TemplatesDir() string { return filepath.Join(k.root, "templates") }

func (k *Kernel) scratch() string { return filepath.Join(k.root, "scratch") }

func (k *Kernel) scratchDir(id string) string { return filepath.Join(k.scratch(), id) }

func (k *Kernel) mountRoot(id string) string { return filepath.Join(k.scratchDir(id), "root") }

func key(kind journal.Kind, name string) string { return string(kind) + "/" + name }

// Refuse makes removing the object kind/name fail with err (nil: a
// generic "busy" error), and the object stay, until Allow.
func (k *Kernel) Refuse(kind journal.Kind, name string, err error) {
	k.inject(k.refuse, kind, name, err, "%s %s is busy (refused)")
}

// Allow undoes Refuse.
func (k *Kernel) Allow(kind journal.Kind, name string) { k.inject(k.refuse, kind, name, nil, "") }

// FailMake makes making the object kind/name fail with err (nil: a generic
// error) and change nothing, until ClearFailMake.
func (k *Kernel) FailMake(kind journal.Kind, name string, err error) {
	k.inject(k.failMake, kind, name, err, "making %s %s fails (injected)")
}

// ClearFailMake undoes FailMake.
func (k *Kernel) ClearFailMake(kind journal.Kind, name string) {
	k.inject(k.failMake, kind, name, nil, "")
}

// inject sets kind/name's error in m (Refuse's or FailMake's) to err, or
// to a generic one saying what (a format of kind and name); an empty
// what clears it.
func (k *Kernel) inject(m map[string]error, kind journal.Kind, name string, err error, what string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if what == "" {
		delete(m, key(kind, name))
		return
	}
	if err == nil {
		err = fmt.Errorf("fake kernel: "+what, kind, name)
	}
	m[key(kind, name)] = err
}

// SetDiskUnbounded makes DiskBounded fail with err (nil: bounded again).
func (k *Kernel) SetDiskUnbounded(err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.unbounded = err
}

// KillGuest kills container id's sandbox and gofer processes, as an OOM
// kill of the sandbox or a crash of the sentry would: its runsc state
// stays, its lease cgroup empties, and what only it held (a detached
// superblock, an unnamed namespace) goes.
func (k *Kernel) KillGuest(id string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if c, ok := k.containers[id]; ok {
		k.stopLocked(c)
	}
	k.calls = append(k.calls, "kill-guest "+id)
}

// Charge adds usage to project (a guest wrote files the scratch dir's
// removal does not free, e.g. an open unlinked file).
func (k *Kernel) Charge(projectID uint32, bytes, inodes uint64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if p, ok := k.projects[projectID]; ok {
		p.usedBytes, p.usedInodes = bytes, inodes
	}
}

// Calls lists the kernel calls that change something, in order ("lease
// create sb-g1", ...), and forgets them.
func (k *Kernel) Calls() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	c := k.calls
	k.calls = nil
	return c
}

func (k *Kernel) call(format string, args ...any) {
	k.calls = append(k.calls, fmt.Sprintf(format, args...))
}

func (k *Kernel) refused(kind journal.Kind, name string) error { return k.refuse[key(kind, name)] }

func (k *Kernel) makeFails(kind journal.Kind, name string) error { return k.failMake[key(kind, name)] }

// stopLocked ends c's processes and releases what only they held.
func (k *Kernel) stopLocked(c *container) {
	if !c.alive() {
		return
	}
	c.status = "stopped"
	if c.agent != nil {
		c.agent.stop()
	}
	k.gcLocked()
}

// gcLocked drops superblocks and namespaces nothing holds any more: not
// mounted, not named, not held by a live container.
func (k *Kernel) gcLocked() {
	held := map[string]bool{}
	heldNS := map[uint64]bool{}
	for _, c := range k.containers {
		if c.alive() {
			held[c.dev], heldNS[c.ns] = true, true
		}
	}
	for _, m := range k.mounts {
		held[m.dev] = true
	}
	for _, ino := range k.netns {
		heldNS[ino] = true
	}
	for dev := range k.superblocks {
		if !held[dev] {
			delete(k.superblocks, dev)
		}
	}
	for ino := range k.namespaces {
		if !heldNS[ino] {
			delete(k.namespaces, ino)
		}
	}
	k.gcLinksLocked()
}

func (k *Kernel) populatedLocked(id string) bool {
	if k.held[id] {
		return true
	}
	for _, c := range k.containers {
		if c.alive() && c.cgroup == id {
			return true
		}
	}
	return false
}

// String renders the state as sorted lines, "" when nothing is left.
func (k *Kernel) String() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var lines []string
	add := func(format string, args ...any) { lines = append(lines, fmt.Sprintf(format, args...)) }
	for id := range k.cgroups {
		if k.populatedLocked(id) {
			add("cgroup %s populated", id)
		} else {
			add("cgroup %s", id)
		}
	}
	for _, m := range k.mounts {
		add("mount %s superblock %s lower %s", m.id, m.dev, filepath.Base(m.lower))
	}
	mounted := map[string]bool{}
	for _, m := range k.mounts {
		mounted[m.dev] = true
	}
	for _, sb := range k.superblocks {
		if !mounted[sb.dev] {
			add("superblock %s of %s detached, held by %s", sb.dev, sb.id, k.holdersLocked(sb.dev, 0))
		}
	}
	named := map[uint64]bool{}
	for name, ino := range k.netns {
		named[ino] = true
		add("netns %s net:[%d]", name, ino)
	}
	for _, ns := range k.namespaces {
		if !named[ns.ino] {
			add("namespace net:[%d] of %s unnamed, held by %s", ns.ino, ns.name, k.holdersLocked("", ns.ino))
		}
	}
	for _, c := range k.containers {
		add("runsc %s %s", c.id, c.status)
	}
	for _, p := range k.projects {
		q := k.quotaLocked(p)
		add("disk project %d of %s limit %d bytes %d inodes, used %d bytes %d inodes", p.id, p.dir, q.LimitBytes, q.LimitInodes, q.UsedBytes, q.UsedInodes)
	}
	for _, d := range []struct{ what, dir string }{
		{"bundle", filepath.Join(k.RunDir(), "bundles")}, {"logs", k.LogRoot()}, {"scratch", k.scratch()},
		{"writer dir", k.WritersDir()}, {"block root", k.BlockRootDir()}, {"volume mount point", k.VolumeMountDir()},
		{"agent", filepath.Join(k.RunDir(), "agents")},
	} {
		ents, _ := os.ReadDir(d.dir)
		for _, e := range ents {
			add("%s %s", d.what, e.Name())
		}
	}
	k.renderNetLocked(add)
	k.renderBlockLocked(add)
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

func (k *Kernel) holdersLocked(dev string, ino uint64) string {
	var hs []string
	for _, c := range k.containers {
		if c.alive() && (dev != "" && c.dev == dev || ino != 0 && c.ns == ino) {
			hs = append(hs, "runsc "+c.id)
		}
	}
	slices.Sort(hs)
	if len(hs) == 0 {
		return "nothing"
	}
	return strings.Join(hs, ", ")
}

// Leases is the fake's node.Leases (a lease.Manager).
func (k *Kernel) Leases() *Leases { return (*Leases)(k) }

// RootFS is the fake's node.RootFS (a rootfs.Overlay).
func (k *Kernel) RootFS() *RootFS { return (*RootFS)(k) }

// Netns is the fake's network.Netns (a netpolicy.Netns).
func (k *Kernel) Netns() *Netns { return (*Netns)(k) }

// Runtime is the fake's node.Runtime (a runsc.Runtime).
func (k *Kernel) Runtime() *Runtime { return (*Runtime)(k) }

// Leases fakes lease.Manager.
type Leases Kernel

func (l *Leases) k() *Kernel { return (*Kernel)(l) }

// Dir is where the real manager would have the lease's cgroup ("" for an
// invalid id). Nothing is there on disk.
func (l *Leases) Dir(id string) string {
	if lease.ValidateID(id) != nil {
		return ""
	}
	return filepath.Join(l.k().root, "cgroup", cgroupParent, id)
}

// CgroupsPath is the lease as an OCI cgroupsPath.
func (l *Leases) CgroupsPath(id string) string {
	if lease.ValidateID(id) != nil {
		return ""
	}
	return "/" + cgroupParent + "/" + id
}

// Create makes the lease; an existing one is a conflict (fs.ErrExist).
func (l *Leases) Create(ctx context.Context, s lease.Spec) error {
	if err := s.Validate(); err != nil {
		return fmt.Errorf("create lease: %w", err)
	}
	k := l.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.makeFails(journal.KindCgroup, s.ID); err != nil {
		return fmt.Errorf("create lease %s: %w", s.ID, err)
	}
	if k.cgroups[s.ID] {
		return fmt.Errorf("create lease %s: %w", s.ID, fs.ErrExist)
	}
	k.cgroups[s.ID] = true
	k.cpuMax[s.ID] = []int64{max(s.CPUMillis, s.BootCPUMillis)}
	k.call("lease create %s", s.ID)
	return nil
}

// Populate puts a process into lease id, as a guest would, until the
// lease is killed or removed (a test's stand-in for a guest; the
// lease contract's, leasetest). A missing lease wraps fs.ErrNotExist.
func (l *Leases) Populate(id string) error {
	k := l.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.cgroups[id] {
		return fmt.Errorf("populate lease %s: %w", id, fs.ErrNotExist)
	}
	k.held[id] = true
	return nil
}

// SetCPUMax changes the lease's cpu.max; a missing lease wraps
// fs.ErrNotExist, one out of range lease.ErrInvalid.
func (l *Leases) SetCPUMax(ctx context.Context, id string, millis int64) error {
	if millis < lease.MinCPUMillis || millis > lease.MaxCPUMillis {
		return fmt.Errorf("set cpu.max of %s: %w: cpu_millis %d not in [%d, %d]", id, lease.ErrInvalid, millis, lease.MinCPUMillis, lease.MaxCPUMillis)
	}
	return l.with("set cpu.max of", id, true, func(k *Kernel) error {
		k.cpuMax[id] = append(k.cpuMax[id], millis)
		k.call("lease cpu.max %s %dm", id, millis)
		return nil
	})
}

// Resize gives a live lease s's limits (its cpu.max joins the history);
// a missing lease wraps fs.ErrNotExist, an invalid spec lease.ErrInvalid.
func (l *Leases) Resize(ctx context.Context, s lease.Spec) error {
	if err := s.Validate(); err != nil {
		return fmt.Errorf("resize lease: %w", err)
	}
	return l.with("resize lease", s.ID, true, func(k *Kernel) error {
		k.cpuMax[s.ID] = append(k.cpuMax[s.ID], max(s.CPUMillis, s.BootCPUMillis))
		k.call("lease resize %s %dm %dB %d pids", s.ID, s.CPUMillis, s.MemoryBytes, s.PIDs)
		return nil
	})
}

// CPUMaxHistory is every cpu.max the lease had, in millis, oldest first
// (nil: no such lease).
func (l *Leases) CPUMaxHistory(id string) []int64 {
	k := l.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.cpuMax[id])
}

// Remove kills everything in the lease and removes it; absent is success.
func (l *Leases) Remove(ctx context.Context, id string) error {
	return l.with("remove lease", id, false, func(k *Kernel) error {
		// cgroup.kill first, as the real one: even a lease that then
		// refuses rmdir has no process left.
		k.killLeaseLocked(id)
		if err := k.refused(journal.KindCgroup, id); err != nil {
			return fmt.Errorf("remove lease %s: %w", id, err)
		}
		delete(k.cgroups, id)
		delete(k.cpuMax, id)
		k.call("lease remove %s", id)
		return nil
	})
}

// Kill kills everything in the lease and keeps it; absent is success.
func (l *Leases) Kill(ctx context.Context, id string) error {
	return l.with("kill lease", id, false, func(k *Kernel) error {
		k.killLeaseLocked(id)
		k.call("lease kill %s", id)
		return nil
	})
}

// with runs f under the kernel's lock if lease id exists; an invalid id
// is refused ("verb: ..."), a missing lease is success unless need says
// it wraps fs.ErrNotExist ("verb id: ...").
func (l *Leases) with(verb, id string, need bool, f func(k *Kernel) error) error {
	if err := lease.ValidateID(id); err != nil {
		return fmt.Errorf("%s: %w", verb, err)
	}
	k := l.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.cgroups[id] {
		if need {
			return fmt.Errorf("%s %s: %w", verb, id, fs.ErrNotExist)
		}
		return nil
	}
	return f(k)
}

// killLeaseLocked stops every guest in lease id (cgroup.kill).
func (k *Kernel) killLeaseLocked(id string) {
	delete(k.held, id)
	for _, c := range k.containers {
		if c.cgroup == id {
			k.stopLocked(c)
		}
	}
}

// Populated reports whether the lease exists and has processes.
func (l *Leases) Populated(ctx context.Context, id string) (bool, error) {
	if err := lease.ValidateID(id); err != nil {
		return false, err
	}
	k := l.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.cgroups[id] && k.populatedLocked(id), nil
}

// List returns the leases, sorted.
func (l *Leases) List(ctx context.Context) ([]string, error) {
	k := l.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Sorted(maps.Keys(k.cgroups)), nil
}

// Stats counts the lease's processes; a missing lease wraps fs.ErrNotExist.
func (l *Leases) Stats(ctx context.Context, id string) (lease.Stats, error) {
	var st lease.Stats
	err := l.with("read lease stats", id, true, func(k *Kernel) error {
		if k.populatedLocked(id) {
			st.Procs = 2 // sandbox and gofer
		}
		st.OOMKills = k.oomKills[id]
		return nil
	})
	return st, err
}

// CheckGone is ok only if the lease's cgroup does not exist.
func (l *Leases) CheckGone(ctx context.Context, id string) (bool, string) {
	if err := lease.ValidateID(id); err != nil {
		return false, err.Error()
	}
	k := l.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.cgroups[id] {
		return true, fmt.Sprintf("cgroup %s absent", l.Dir(id))
	}
	return false, fmt.Sprintf("cgroup %s exists (populated=%t)", l.Dir(id), k.populatedLocked(id))
}

// RootFS fakes rootfs.Overlay (mounts and disk projects).
type RootFS Kernel

func (r *RootFS) k() *Kernel { return (*Kernel)(r) }

func validID(id string) error {
	if !names.Valid(id) {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "invalid sandbox id %q: %s", id, names.Rule)
	}
	return nil
}

// Mount mounts the overlay of id over lower; the same overlay already
// mounted is success, another one there a conflict.
func (r *RootFS) Mount(ctx context.Context, id, lower string) (string, error) {
	if err := validID(id); err != nil {
		return "", err
	}
	if err := rootfs.CheckOverlayPath("template dir", lower); err != nil {
		return "", err
	}
	if fi, err := os.Stat(lower); err != nil {
		return "", fmt.Errorf("stat template dir: %w", err)
	} else if !fi.IsDir() {
		return "", errdefs.Errorf(errdefs.CodeInvalidArgument, "template %q is not a directory", lower)
	}
	k := r.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.makeFails(journal.KindMount, id); err != nil {
		return "", err
	}
	target := k.mountRoot(id)
	if m, ok := k.mounts[id]; ok {
		if m.lower != filepath.Clean(lower) {
			return "", errdefs.Errorf(errdefs.CodeConflict, "%s is already mounted (overlay, lowerdir=%q), want overlay over %q", target, m.lower, lower)
		}
		return target, nil
	}
	if err := os.MkdirAll(target, 0o700); err != nil {
		return "", fmt.Errorf("make dir %s: %w", target, err)
	}
	// The guest sees the template's top directories (its /tmp), as through
	// an overlay; their files it does not need.
	ents, err := os.ReadDir(lower)
	if err != nil {
		return "", fmt.Errorf("read template dir: %w", err)
	}
	for _, e := range ents {
		if e.IsDir() {
			if err := os.MkdirAll(filepath.Join(target, e.Name()), 0o755); err != nil {
				return "", fmt.Errorf("make dir %s: %w", target, err)
			}
		}
	}
	dev := fmt.Sprintf("0:%d", k.next)
	k.next++
	k.mounts[id] = &mount{id: id, lower: filepath.Clean(lower), dev: dev}
	k.superblocks[dev] = &superblock{dev: dev, id: id}
	k.call("mount %s", id)
	return target, nil
}

// Unmount unmounts id's overlay (lazily, if a guest still holds it) and
// removes its scratch dir; nothing there is success.
func (r *RootFS) Unmount(ctx context.Context, id string) error {
	if err := validID(id); err != nil {
		return err
	}
	k := r.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.refused(journal.KindMount, id); err != nil {
		if _, ok := k.mounts[id]; ok {
			return fmt.Errorf("unmount %s: %w", k.mountRoot(id), err)
		}
	}
	if _, ok := k.mounts[id]; ok {
		delete(k.mounts, id)
		k.gcLocked()
		k.call("unmount %s", id)
	}
	if err := os.RemoveAll(k.scratchDir(id)); err != nil {
		return fmt.Errorf("remove scratch dir %s: %w", k.scratchDir(id), err)
	}
	return nil
}

// List returns the ids with a scratch dir or a mount, sorted.
func (r *RootFS) List(ctx context.Context) ([]string, error) {
	k := r.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	ids, err := listIDs(k.scratch(), maps.Keys(k.mounts))
	if err != nil {
		return nil, fmt.Errorf("list scratch dir: %w", err)
	}
	return ids, nil
}

// listIDs is the real roots' List: the valid ids among dir's entries and
// the mounted ones, sorted.
func listIDs(dir string, mounted iter.Seq[string]) ([]string, error) {
	seen := map[string]bool{}
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	for _, e := range ents {
		seen[e.Name()] = true
	}
	for id := range mounted {
		seen[id] = true
	}
	var out []string
	for id := range seen {
		if validID(id) == nil {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out, nil
}

// Mounted returns the ids whose overlay is mounted, sorted.
func (r *RootFS) Mounted(ctx context.Context) ([]string, error) {
	k := r.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Sorted(maps.Keys(k.mounts)), nil
}

// Superblock is the device of id's mounted overlay.
func (r *RootFS) Superblock(id string) (string, error) {
	if err := validID(id); err != nil {
		return "", err
	}
	k := r.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	m, ok := k.mounts[id]
	if !ok {
		return "", fmt.Errorf("no overlay mounted at %s", k.mountRoot(id))
	}
	return m.dev, nil
}

// CheckGone: nothing mounted, no scratch dir, and (when dev is known) the
// superblock held by no process.
func (r *RootFS) CheckGone(ctx context.Context, id, dev string) (bool, string) {
	if err := validID(id); err != nil {
		return false, err.Error()
	}
	k := r.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	dir := k.scratchDir(id)
	if m, ok := k.mounts[id]; ok {
		return false, fmt.Sprintf("1 mount(s) left under %s, first %s (overlay %s)", dir, k.mountRoot(id), m.dev)
	}
	if _, err := os.Lstat(dir); err == nil {
		return false, fmt.Sprintf("no mounts under %s but the dir still exists", dir)
	}
	// The real check finds a mounted copy by its upperdir whatever dev
	// says; a detached one only by dev, through its holders.
	if dev == "" {
		return true, fmt.Sprintf("no mounts under %s and the dir is gone; superblock device not recorded, holders not checked", dir)
	}
	if sb, ok := k.superblocks[dev]; ok && sb.id == id {
		return false, fmt.Sprintf("overlay superblock %s is detached but alive: held by %s", dev, k.holdersLocked(dev, 0))
	}
	return true, fmt.Sprintf("no mounts under %s and the dir is gone; overlay superblock %s held by no process", dir, dev)
}

// DiskBounded is nil unless SetDiskUnbounded said otherwise.
func (r *RootFS) DiskBounded() error {
	k := r.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.unbounded != nil {
		return errdefs.Errorf(errdefs.CodeUnavailable, "disk lease cannot be enforced: %v", k.unbounded)
	}
	return nil
}

// LimitDisk makes id's scratch dir and limits project to bytes;
// idempotent for the same dir; a project another dir uses is a conflict.
func (r *RootFS) LimitDisk(ctx context.Context, id string, projectID uint32, bytes int64) error {
	if err := validID(id); err != nil {
		return err
	}
	if projectID == 0 || bytes <= 0 {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "disk limit of %s: project %d, %d bytes: both must be positive", id, projectID, bytes)
	}
	if err := r.DiskBounded(); err != nil {
		return err
	}
	k := r.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.makeFails(journal.KindDisk, id); err != nil {
		return err
	}
	if p, ok := k.projects[projectID]; ok && p.dir != id && !k.quotaLocked(p).Empty() {
		return errdefs.Errorf(errdefs.CodeConflict, "project id %d is already in use on the scratch filesystem", projectID)
	}
	if err := os.MkdirAll(k.scratchDir(id), 0o700); err != nil {
		return fmt.Errorf("make dir %s: %w", k.scratchDir(id), err)
	}
	k.projects[projectID] = &project{id: projectID, dir: id, limitBytes: (uint64(bytes) + 1023) / 1024 * 1024, inodes: rootfs.DiskInodes(bytes)}
	k.call("disk limit %d %s", projectID, id)
	return nil
}

// quotaLocked is what the filesystem would report for p: its limit, and
// the usage of its dir's files (each file and dir one inode) while the
// dir exists.
func (k *Kernel) quotaLocked(p *project) diskquota.Quota {
	q := diskquota.Quota{ID: p.id, LimitBytes: p.limitBytes, LimitInodes: p.inodes, UsedBytes: p.usedBytes, UsedInodes: p.usedInodes}
	_ = filepath.WalkDir(k.scratchDir(p.dir), func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		q.UsedInodes++
		if fi, err := d.Info(); err == nil && fi.Mode().IsRegular() {
			q.UsedBytes += uint64(fi.Size())
		}
		return nil
	})
	return q
}

// RemoveScratch removes id's scratch dir if it is empty (what LimitDisk
// made before a mount); absent is success, content is refused.
func (r *RootFS) RemoveScratch(id string) error {
	if err := validID(id); err != nil {
		return err
	}
	k := r.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := os.Remove(k.scratchDir(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove scratch dir %s: %w", k.scratchDir(id), err)
	}
	return nil
}

// UnlimitDisk clears project's limit once nothing is charged to it;
// already clear is success.
func (r *RootFS) UnlimitDisk(ctx context.Context, projectID uint32) error {
	if projectID == 0 {
		return nil
	}
	k := r.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	p, ok := k.projects[projectID]
	if !ok {
		return nil
	}
	if err := k.refused(journal.KindDisk, strconv.FormatUint(uint64(projectID), 10)); err != nil {
		return err
	}
	if q := k.quotaLocked(p); q.UsedBytes != 0 || q.UsedInodes != 0 {
		return fmt.Errorf("project %d still holds %d bytes in %d inodes; keeping its disk limit", projectID, q.UsedBytes, q.UsedInodes)
	}
	delete(k.projects, projectID)
	k.call("disk unlimit %d", projectID)
	return nil
}

// CheckDiskGone: the project has no limit and no usage.
func (r *RootFS) CheckDiskGone(ctx context.Context, projectID uint32) (bool, string) {
	if projectID == 0 {
		return true, "no disk lease"
	}
	k := r.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	if p, ok := k.projects[projectID]; ok {
		q := k.quotaLocked(p)
		return false, fmt.Sprintf("project %d still has limit %d bytes/%d inodes and uses %d bytes in %d inodes", projectID, q.LimitBytes, q.LimitInodes, q.UsedBytes, q.UsedInodes)
	}
	return true, fmt.Sprintf("project %d: no limit, no usage", projectID)
}

// DiskProjects lists the projects in [from, to) with a limit or usage.
func (r *RootFS) DiskProjects(ctx context.Context, from, to uint32) ([]diskquota.Quota, error) {
	k := r.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []diskquota.Quota
	for id, p := range k.projects {
		if id >= from && id < to {
			out = append(out, k.quotaLocked(p))
		}
	}
	slices.SortFunc(out, func(a, b diskquota.Quota) int { return int(a.ID) - int(b.ID) })
	return out, nil
}

// Netns fakes netpolicy.Netns.
type Netns Kernel

func (n *Netns) k() *Kernel { return (*Kernel)(n) }

// Path is where the named namespace's file would be. Nothing is there on
// disk.
func (n *Netns) Path(name string) string {
	return filepath.Join(n.k().root, "netns", netpolicy.DefaultPrefix+name)
}

// Create makes the named namespace; an existing one is returned as is.
func (n *Netns) Create(ctx context.Context, name string) (string, error) {
	if err := validID(name); err != nil {
		return "", err
	}
	k := n.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.makeFails(journal.KindNetns, name); err != nil {
		return "", err
	}
	if _, ok := k.netns[name]; !ok {
		ino := 4026532000 + k.next
		k.next++
		k.netns[name] = ino
		k.namespaces[ino] = &namespace{ino: ino, name: name}
		k.call("netns create %s", name)
	}
	return n.Path(name), nil
}

// Delete removes the name; the namespace lives on while a guest holds it.
// A missing name is success.
func (n *Netns) Delete(ctx context.Context, name string) error {
	if err := validID(name); err != nil {
		return err
	}
	k := n.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.netns[name]; !ok {
		return nil
	}
	if err := k.refused(journal.KindNetns, name); err != nil {
		return fmt.Errorf("unmount netns %s: %w", n.Path(name), err)
	}
	delete(k.netns, name)
	k.gcLocked()
	k.call("netns delete %s", name)
	return nil
}

// List returns the names, sorted.
func (n *Netns) List(ctx context.Context) ([]string, error) {
	k := n.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Sorted(maps.Keys(k.netns)), nil
}

// Mounted returns the names, sorted (every fake name is mounted).
func (n *Netns) Mounted(ctx context.Context) ([]string, error) { return n.List(ctx) }

// Identify returns the named namespace's identity.
func (n *Netns) Identify(ctx context.Context, name string) (netpolicy.NSID, error) {
	if err := validID(name); err != nil {
		return netpolicy.NSID{}, err
	}
	k := n.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	ino, ok := k.netns[name]
	if !ok {
		return netpolicy.NSID{}, fmt.Errorf("identify netns %s: not a mounted network namespace", n.Path(name))
	}
	return netpolicy.NSID{Dev: nsfsDev, Ino: ino, Cookie: ino + 1}, nil
}

// CheckGone: the name is gone and (when id is known) the namespace is
// held by no process.
func (n *Netns) CheckGone(ctx context.Context, name string, id netpolicy.NSID) (bool, string) {
	if err := validID(name); err != nil {
		return false, err.Error()
	}
	k := n.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	p := n.Path(name)
	if _, ok := k.netns[name]; ok {
		return false, fmt.Sprintf("%s still mounted (nsfs)", p)
	}
	if !id.Known() {
		return true, fmt.Sprintf("%s absent and not mounted; namespace identity not recorded: holders not checked", p)
	}
	if ns, ok := k.namespaces[id.Ino]; ok && id.Cookie == ns.ino+1 {
		return false, fmt.Sprintf("namespace %s still alive: held by %s", id, k.holdersLocked("", id.Ino))
	}
	return true, fmt.Sprintf("%s absent and not mounted; namespace %s: no thread in it", p, id)
}

// Runtime fakes runsc.Runtime.
type Runtime Kernel

func (r *Runtime) k() *Kernel { return (*Kernel)(r) }

// LogRoot is the directory of the per-container log directories.
func (r *Runtime) LogRoot() string { return filepath.Join(r.k().root, "runsc.logs") }

// LogRoot is Runtime().LogRoot().
func (k *Kernel) LogRoot() string { return k.Runtime().LogRoot() }

// ContainerLogDir is container id's log directory.
func (r *Runtime) ContainerLogDir(id string) string { return filepath.Join(r.LogRoot(), id) }

// prepareLog makes id's log dir, as every real runsc command about a
// container does (so a repeated teardown makes it again); a bad id is
// refused first, as the real runtime's.
func (r *Runtime) prepareLog(id string) error {
	if err := runsc.ValidID(id); err != nil {
		return fmt.Errorf("runsc: %w", err)
	}
	if err := os.MkdirAll(r.ContainerLogDir(id), 0o700); err != nil {
		return fmt.Errorf("create runsc log dir: %w", err)
	}
	return nil
}

func (r *Runtime) appendLog(id, line string) {
	f, err := os.OpenFile(filepath.Join(r.ContainerLogDir(id), "runsc.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err == nil {
		fmt.Fprintln(f, line)
		f.Close()
	}
}

func notExist(verb, id string) error {
	return fmt.Errorf("runsc %s %s: loading container: file does not exist: %w", verb, id, runsc.ErrNotExist)
}

// Create creates container id from its bundle: its sandbox joins the
// lease named by the spec's cgroupsPath, holds its root's superblock and
// its netns. An existing container is an error.
func (r *Runtime) Create(ctx context.Context, id, bundleDir string) error {
	if err := runsc.ValidID(id); err != nil {
		return fmt.Errorf("runsc create: %w", err)
	}
	if err := r.prepareLog(id); err != nil {
		return err
	}
	b, err := os.ReadFile(filepath.Join(bundleDir, "config.json"))
	if err != nil {
		return fmt.Errorf("runsc create %s: reading spec: %w", id, err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil || spec.Root == nil || spec.Linux == nil {
		return fmt.Errorf("runsc create %s: bad spec: %v", id, err)
	}
	k := r.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.makeFails(journal.KindRunsc, id); err != nil {
		return fmt.Errorf("runsc create %s: %w", id, err)
	}
	if _, ok := k.containers[id]; ok {
		return fmt.Errorf("runsc create %s: container with id %s already exists: %w", id, id, fs.ErrExist)
	}
	c := &container{id: id, bundle: bundleDir, status: "created", cgroup: filepath.Base(spec.Linux.CgroupsPath)}
	if _, err := os.Stat(spec.Root.Path); err != nil {
		return fmt.Errorf("runsc create %s: root: %w", id, err)
	}
	for _, m := range k.mounts {
		if k.mountRoot(m.id) == spec.Root.Path {
			c.dev = m.dev
		}
	}
	for _, ns := range spec.Linux.Namespaces {
		if ns.Type != specs.NetworkNamespace || ns.Path == "" {
			continue
		}
		name, _ := strings.CutPrefix(filepath.Base(ns.Path), netpolicy.DefaultPrefix)
		ino, ok := k.netns[name]
		if !ok || ns.Path != r.k().Netns().Path(name) {
			return fmt.Errorf("runsc create %s: open netns %s: no such file or directory", id, ns.Path)
		}
		c.ns = ino
	}
	if spec.Linux.CgroupsPath != "" && !k.cgroups[c.cgroup] {
		k.cgroups[c.cgroup] = true // runsc makes a missing cgroup
	}
	k.containers[id] = c
	k.call("runsc create %s", id)
	r.appendLog(id, "create")
	if err := os.WriteFile(filepath.Join(r.ContainerLogDir(id), "init.log"), nil, 0o600); err != nil {
		return err
	}
	return nil
}

// Start starts a created container's init.
func (r *Runtime) Start(ctx context.Context, id string) error {
	if err := r.prepareLog(id); err != nil {
		return err
	}
	k := r.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	c, ok := k.containers[id]
	if !ok {
		return notExist("start", id)
	}
	if c.status != "created" {
		return fmt.Errorf("runsc start %s: cannot start a container in the %s state", id, c.status)
	}
	if err := k.startAgent(c); err != nil {
		return fmt.Errorf("runsc start %s: init: %w", id, err)
	}
	c.status = "running"
	k.call("runsc start %s", id)
	return nil
}

// Exec runs p in the running container id. The fake guest knows echo,
// true, false and cat (stdin to stdout); anything else exits 127.
func (r *Runtime) Exec(ctx context.Context, id string, p runsc.ExecProcess, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	if err := r.prepareLog(id); err != nil {
		return -1, err
	}
	k := r.k()
	k.mu.Lock()
	c, ok := k.containers[id]
	var err error
	switch {
	case !ok:
		err = notExist("exec", id)
	case c.status != "running":
		err = fmt.Errorf("runsc exec %s: cannot exec in a %s container", id, c.status)
	case p.CgroupDir != "" && (p.CgroupDir != k.Leases().Dir(c.cgroup) || !k.cgroups[c.cgroup]):
		err = fmt.Errorf("open cgroup of exec in %s: %s: %w", id, p.CgroupDir, fs.ErrNotExist)
	default:
		err = k.makeFails(KindExec, id)
	}
	k.mu.Unlock()
	if err != nil {
		return -1, err
	}
	if len(p.Args) == 0 {
		return -1, fmt.Errorf("runsc exec %s: no args", id)
	}
	switch filepath.Base(p.Args[0]) {
	case "echo":
		fmt.Fprintln(stdout, strings.Join(p.Args[1:], " "))
		return 0, nil
	case "true":
		return 0, nil
	case "false":
		return 1, nil
	case "cat":
		if stdin == nil {
			stdin = bytes.NewReader(nil)
		}
		_, err := io.Copy(stdout, stdin)
		return 0, err
	}
	fmt.Fprintf(stderr, "%s: not found\n", p.Args[0])
	return 127, nil
}

// Kill signals the container's processes (any signal kills in the fake).
func (r *Runtime) Kill(ctx context.Context, id string, sig syscall.Signal, all bool) error {
	if err := r.prepareLog(id); err != nil {
		return err
	}
	k := r.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	c, ok := k.containers[id]
	if !ok {
		return notExist("kill", id)
	}
	if err := k.refused(journal.KindRunsc, id); err != nil {
		return fmt.Errorf("runsc kill %s: %w", id, err)
	}
	k.stopLocked(c)
	k.call("runsc kill %s", id)
	return nil
}

// Delete destroys the container, killing it if it runs; absent is success.
func (r *Runtime) Delete(ctx context.Context, id string) error {
	if err := r.prepareLog(id); err != nil {
		return err
	}
	k := r.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	c, ok := k.containers[id]
	if !ok {
		return nil
	}
	if err := k.refused(journal.KindRunsc, id); err != nil {
		return fmt.Errorf("runsc delete %s: %w", id, err)
	}
	k.stopLocked(c)
	delete(k.containers, id)
	k.call("runsc delete %s", id)
	return nil
}

// Known lists the containers with state, sorted.
func (r *Runtime) Known() ([]string, error) {
	k := r.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Sorted(maps.Keys(k.containers)), nil
}

// CheckGone: no state and no process of the container.
func (r *Runtime) CheckGone(ctx context.Context, id string) (bool, string) {
	k := r.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	c, ok := k.containers[id]
	if !ok {
		return true, "not listed, no state files, no sandbox/gofer processes"
	}
	left := []string{"listed by runsc list", "state file " + id + "_sandbox:" + id + ".state"}
	if c.alive() {
		left = append(left, "process sandbox", "process gofer")
	}
	return false, strings.Join(left, "; ")
}
