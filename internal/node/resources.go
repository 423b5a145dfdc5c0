package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/resource"
	"github.com/ctld/ctld/internal/proof"
	"github.com/ctld/ctld/internal/runsc"
)

// A generation owns one object of each resource kind in the table below.
// Every part of the node walks the same table, so a new kind is one entry:
//   - a claim makes the entries in order, each journaled by effect()
//     (intended, made, done) before and after the kernel call;
//   - a teardown removes them in reverse order, each journaled as removing
//     first; an entry the journal never saw intended is not removed but
//     its proof check still runs (and, should the object exist after all,
//     removes it as a second line of defence, which is reported);
//   - the cleanup proof has one check per entry;
//   - reconcile asks each entry whether a ready generation's object is
//     missing, finishes effect records no live generation owns, and sweeps
//     the kernel for objects under ctld's names that no generation owns.
type entry = resource.Entry[*resource.Claim]

// newTable is the resource table: claim order is by phase
// (resource.Phase), then by the order of registration here.
func newTable(n *Node) *resource.Table[*resource.Claim] {
	var b resource.Builder[*resource.Claim]
	register(&b, n)
	return b.Table()
}

// register adds the node's entries to b, one line per concern. Within a
// phase, claim order is the order here: the log dir before the lease (the
// log writer of runsc create needs it) before the agent dir, the bundle
// and runsc (last: the guest); the disk quota before the overlay mount
// (the quota bounds the scratch dir before the upper is used); the writer
// before the block mount; persistent volumes after the root (the bundle
// binds them); the netns before the links (which need its path), the
// conntrack flush after the nft objects that mark flows are gone, the
// policy before the DNS entry (which adds answers to its sets).
func register(b *resource.Builder[*resource.Claim], n *Node) {
	add := func(es ...entry) {
		for _, e := range es {
			// The entries still check their subsystems themselves (issue
			// 26: the concern packages register only what is configured).
			b.Add(e, true)
		}
	}
	add(logsResource{n: n}, cgroupResource{n}, agentResource{n: n}, bundleResource{n: n}, runscResource{n}) // guest
	add(diskResource{n: n}, mountResource{n})                                                               // overlay
	add(n.blockRoot().Entries()...)                                                                         // blockroot
	add(n.pvolumes())                                                                                       // pvolume
	add(netnsResource{n}, linksResource{n}, conntrackResource{n: n}, nftResource{n}, dnsResource{n: n})     // network
}

// CrashPoints lists every crash point of a generation's life, in the order
// a claim and then its teardown and a takeover's orphan handling reach
// them (see Deps.Crash): derived from the table's declared specs.
func CrashPoints() []string { return newTable(&Node{}).CrashPoints(updateCrashPoints) }

type logsResource struct {
	n *Node
}

func (logsResource) Spec() resource.Spec {
	return resource.Spec{Kind: journal.KindLogs, Phase: resource.PhaseLease, Check: "logs_removed", Sweeps: true}
}
func (r logsResource) Make(_ context.Context, c *resource.Claim) error {
	if err := r.n.logDirs().Make(c.Rec.ContainerID); err != nil {
		return fmt.Errorf("make log dir: %w", err)
	}
	return nil
}
func (r logsResource) Remove(_ context.Context, rec journal.Sandbox) error {
	return r.n.logDirs().Remove(rec.ContainerID)
}
func (r logsResource) Gone(_ context.Context, rec journal.Sandbox) proof.Check {
	ok, d := r.n.logDirs().CheckGone(rec.ContainerID)
	return resource.Check("logs_removed", ok, d)
}
func (r logsResource) List(ctx context.Context) ([]string, error) {
	return r.n.listLogs(ctx)
}
func (logsResource) Name(rec journal.Sandbox) string { return resource.NameOf(rec) }
func (r logsResource) RemoveOrphan(_ context.Context, name string) error {
	return r.n.logDirs().Remove(name)
}

type cgroupResource struct{ n *Node }

func (cgroupResource) Spec() resource.Spec {
	return resource.Spec{Kind: journal.KindCgroup, Phase: resource.PhaseLease, Check: "cgroup_removed", Sweeps: true}
}
func (r cgroupResource) Make(ctx context.Context, c *resource.Claim) error {
	if err := r.n.d.Leases.Create(ctx, leaseSpec(c.Rec.ContainerID, c.Rec.Resources, r.n.cfg.BootCPUMillis, c.Rec.RuntimePIDs)); err != nil {
		return fmt.Errorf("create lease: %w", err)
	}
	return nil
}
func (r cgroupResource) Remove(ctx context.Context, rec journal.Sandbox) error {
	return r.n.d.Leases.Remove(ctx, rec.LeaseID)
}
func (r cgroupResource) Gone(ctx context.Context, rec journal.Sandbox) proof.Check {
	ok, d := r.n.d.Leases.CheckGone(ctx, rec.LeaseID)
	return resource.Check("cgroup_removed", ok, d)
}
func (r cgroupResource) List(ctx context.Context) ([]string, error) {
	return r.n.d.Leases.List(ctx)
}
func (cgroupResource) Name(rec journal.Sandbox) string { return rec.LeaseID }
func (r cgroupResource) RemoveOrphan(ctx context.Context, name string) error {
	return r.n.d.Leases.Remove(ctx, name)
}

// missing: the guest is alive while its lease cgroup is populated: runsc
// puts the sandbox and gofer processes there, and they die together.
func (r cgroupResource) Survey(context.Context) (resource.Missing, error) {
	return func(ctx context.Context, rec journal.Sandbox) string {
		if alive, err := r.n.d.Leases.Populated(ctx, rec.LeaseID); err != nil || !alive {
			return "guest processes"
		}
		return ""
	}, nil
}

// diskResource is the project quota that bounds the scratch dir. Its name
// is the project id, allocated in the claim's journal transaction.
type diskResource struct {
	n *Node
}

func (diskResource) Spec() resource.Spec {
	return resource.Spec{Kind: journal.KindDisk, Phase: resource.PhaseRootFS, Mode: journal.RootFSOverlay, Check: "disk_quota_cleared", Sweeps: true}
}
func (r diskResource) Make(ctx context.Context, c *resource.Claim) error {
	rec := c.Rec
	if rec.DiskProject == 0 {
		return fmt.Errorf("limit disk: generation %d of %s has no disk project", rec.Generation, rec.ID)
	}
	if err := r.n.d.RootFS.LimitDisk(ctx, rec.ContainerID, rec.DiskProject, rec.Resources.DiskBytes); err != nil {
		return fmt.Errorf("limit disk: %w", err)
	}
	return nil
}

// Remove removes the scratch dir the claim step made (once the overlay in
// it is gone, the mount entry's removal took it already), then the quota:
// the project's limit is cleared only once nothing is charged to it.
func (r diskResource) Remove(ctx context.Context, rec journal.Sandbox) error {
	if err := r.n.d.RootFS.RemoveScratch(rec.ContainerID); err != nil {
		return err
	}
	if rec.DiskProject == 0 {
		return nil // a record from before disk leases: the sweep covers ctld's range
	}
	return r.n.d.RootFS.UnlimitDisk(ctx, rec.DiskProject)
}
func (r diskResource) Gone(ctx context.Context, rec journal.Sandbox) proof.Check {
	ok, d := r.n.d.RootFS.CheckDiskGone(ctx, rec.DiskProject)
	return resource.Check("disk_quota_cleared", ok, d)
}

// List lists the projects of ctld's range that have a quota.
func (r diskResource) List(ctx context.Context) ([]string, error) {
	pr := r.n.diskProjects()
	qs, err := r.n.d.RootFS.DiskProjects(ctx, pr.Base, pr.Base+pr.Count)
	var out []string
	for _, q := range qs {
		out = append(out, strconv.FormatUint(uint64(q.ID), 10))
	}
	return out, err
}
func (diskResource) Name(rec journal.Sandbox) string {
	if rec.DiskProject == 0 {
		return ""
	}
	return strconv.FormatUint(uint64(rec.DiskProject), 10)
}
func (r diskResource) RemoveOrphan(ctx context.Context, name string) error {
	id, err := strconv.ParseUint(name, 10, 32)
	if err != nil {
		return fmt.Errorf("disk project %q: %w", name, err)
	}
	return r.n.d.RootFS.UnlimitDisk(ctx, uint32(id))
}

type mountResource struct{ n *Node }

func (mountResource) Spec() resource.Spec {
	return resource.Spec{Kind: journal.KindMount, Phase: resource.PhaseRootFS, Mode: journal.RootFSOverlay, Check: "mounts_gone", Sweeps: true}
}
func (r mountResource) Make(ctx context.Context, c *resource.Claim) (err error) {
	if c.Root, err = r.n.d.RootFS.Mount(ctx, c.Rec.ContainerID, c.Lower); err != nil {
		return fmt.Errorf("mount rootfs: %w", err)
	}
	return nil
}
func (r mountResource) Remove(ctx context.Context, rec journal.Sandbox) error {
	return r.n.d.RootFS.Unmount(ctx, rec.ContainerID)
}
func (r mountResource) Gone(ctx context.Context, rec journal.Sandbox) proof.Check {
	ok, d := r.n.d.RootFS.CheckGone(ctx, rec.ContainerID, rec.RootDev)
	return resource.Check("mounts_gone", ok, d)
}
func (r mountResource) List(ctx context.Context) ([]string, error) {
	return r.n.d.RootFS.List(ctx)
}
func (mountResource) Name(rec journal.Sandbox) string { return resource.NameOf(rec) }
func (r mountResource) RemoveOrphan(ctx context.Context, name string) error {
	return r.n.d.RootFS.Unmount(ctx, name)
}
func (r mountResource) Survey(ctx context.Context) (resource.Missing, error) {
	mounts, err := r.n.d.RootFS.Mounted(ctx)
	if err != nil {
		return nil, fmt.Errorf("list rootfs mounts: %w", err)
	}
	return missingUnless(resource.SetOf(mounts), resource.NameOf, "rootfs mount"), nil
}

type netnsResource struct{ n *Node }

func (netnsResource) Spec() resource.Spec {
	return resource.Spec{Kind: journal.KindNetns, Phase: resource.PhaseNetwork, Check: "netns_gone", Sweeps: true}
}
func (r netnsResource) Make(ctx context.Context, c *resource.Claim) (err error) {
	if tookCarrier(c.Rec) {
		// A warm carrier's netns, made before the claim (carriers.go).
		c.NSPath = r.n.d.Netns.Path(c.Rec.Netns)
	} else if c.NSPath, err = r.n.d.Netns.Create(ctx, c.Rec.ContainerID); err != nil {
		return fmt.Errorf("create netns: %w", err)
	}
	// The overlay and the netns both exist now: journal their kernel
	// identities (with this entry's done record), so the proof checks
	// these objects and not only names.
	var changed bool
	if c.Rec, changed = r.n.readIdentities(ctx, c.Rec); changed {
		rec := c.Rec
		c.WithDone(func(tx *journal.Tx) error { return putIdentities(tx, rec) })
	}
	return nil
}
func (r netnsResource) Remove(ctx context.Context, rec journal.Sandbox) error {
	return r.n.d.Netns.Delete(ctx, netnsName(rec))
}
func (r netnsResource) Gone(ctx context.Context, rec journal.Sandbox) proof.Check {
	ok, d := r.n.d.Netns.CheckGone(ctx, netnsName(rec), netnsID(rec))
	return resource.Check("netns_gone", ok, d)
}
func (r netnsResource) List(ctx context.Context) ([]string, error) {
	return r.n.d.Netns.List(ctx)
}
func (netnsResource) Name(rec journal.Sandbox) string { return netnsName(rec) }
func (r netnsResource) RemoveOrphan(ctx context.Context, name string) error {
	return r.n.d.Netns.Delete(ctx, name)
}
func (r netnsResource) Survey(ctx context.Context) (resource.Missing, error) {
	netns, err := r.n.d.Netns.Mounted(ctx)
	if err != nil {
		return nil, fmt.Errorf("list netns mounts: %w", err)
	}
	return missingUnless(resource.SetOf(netns), netnsName, "netns"), nil
}

// bundleResource is the OCI bundle (config.json) runsc is created from.
type bundleResource struct {
	n *Node
}

func (bundleResource) Spec() resource.Spec {
	return resource.Spec{Kind: journal.KindBundle, Phase: resource.PhaseGuest, Check: "bundle_removed", Sweeps: true}
}
func (r bundleResource) Make(_ context.Context, c *resource.Claim) error {
	rec, req := c.Rec, c.Rec.Request
	args := req.Process.Args
	if len(args) == 0 {
		args = r.n.cfg.DefaultArgs
	}
	// The guest's resolv.conf lives in the bundle: it goes with it.
	var resolv string
	ns, err := r.n.guestNameservers(rec)
	if err != nil {
		return err
	}
	if len(ns) > 0 {
		resolv = filepath.Join(rec.Bundle, runsc.ResolvConfFile)
		if err := runsc.WriteResolvConf(resolv, ns); err != nil {
			return err
		}
	}
	// The spec's resources are the lease's, for the record: runsc
	// (20221219) leaves a cgroup it did not create alone, so they never
	// end a boot CPU allowance (lease's TestKernelRunscPrecreatedLease).
	oci, err := runsc.BuildSpec(runsc.BundleSpec{
		ContainerID: rec.ContainerID, RootPath: c.Root, Hostname: rec.ID, NetnsPath: c.NSPath,
		CgroupsPath: r.n.d.Leases.CgroupsPath(rec.LeaseID), CPUMillis: req.Resources.CPUMillis,
		MemoryBytes: req.Resources.MemoryBytes, PIDs: rec.Resources.PIDs + rec.RuntimePIDs,
		Args: args, Env: req.Process.Env, Cwd: req.Process.Cwd, UID: req.Process.UID, GID: req.Process.GID,
		OOMScoreAdj: r.n.cfg.GuestOOMScoreAdj, ResolvConf: resolv, Agent: r.n.agentSpec(rec),
		Binds: c.Binds,
	})
	if err != nil {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "build OCI spec: %v", err)
	}
	if err := runsc.WriteBundle(rec.Bundle, oci); err != nil {
		return fmt.Errorf("write bundle: %w", err)
	}
	return nil
}
func (r bundleResource) Remove(_ context.Context, rec journal.Sandbox) error {
	return os.RemoveAll(r.n.bundleDir(rec.ContainerID))
}
func (r bundleResource) Gone(_ context.Context, rec journal.Sandbox) proof.Check {
	return resource.PathGone("bundle_removed", r.n.bundleDir(rec.ContainerID))
}
func (r bundleResource) List(context.Context) ([]string, error) {
	return resource.DirEntries(filepath.Join(r.n.cfg.RunDir, "bundles"))
}

func (bundleResource) Name(rec journal.Sandbox) string { return resource.NameOf(rec) }
func (r bundleResource) RemoveOrphan(_ context.Context, name string) error {
	return os.RemoveAll(r.n.bundleDir(name))
}

// runscResource is the guest: runsc's container (sandbox, gofer, state).
type runscResource struct{ n *Node }

func (runscResource) Spec() resource.Spec {
	return resource.Spec{Kind: journal.KindRunsc, Phase: resource.PhaseGuest, Check: "runsc_container_gone", Sweeps: true}
}
func (r runscResource) Make(ctx context.Context, c *resource.Claim) error {
	cid := c.Rec.ContainerID
	if err := r.n.d.Runtime.Create(ctx, cid, c.Rec.Bundle); err != nil {
		return fmt.Errorf("start container: %w", err)
	}
	if err := r.n.d.Runtime.Start(ctx, cid); err != nil {
		return fmt.Errorf("start container: %w", err)
	}
	return nil
}

// Remove ends the guest through its lease, whose cgroup.kill takes the
// sandbox, gofer, exec processes and log writer at once and returns when
// the kernel says they are gone, then deletes the container:
// runsc.Runtime.Delete finds it dead and removes runsc's state itself,
// where `runsc kill --all` and `runsc delete --force` cost two runsc starts
// and delete's 100 ms polls for the sandbox to be reaped (BenchmarkRelease
// in internal/runsc). If the lease cannot be emptied, runsc kills.
func (r runscResource) Remove(ctx context.Context, rec journal.Sandbox) error {
	if err := r.n.d.Leases.Kill(ctx, rec.LeaseID); err != nil {
		r.n.log.Warn("kill the guest through its lease failed; runsc kills it", "sandbox", rec.ID, "generation", rec.Generation, "err", err)
		return r.RemoveOrphan(ctx, rec.ContainerID)
	}
	return r.n.d.Runtime.Delete(ctx, rec.ContainerID)
}
func (r runscResource) Gone(ctx context.Context, rec journal.Sandbox) proof.Check {
	ok, d := r.n.d.Runtime.CheckGone(ctx, rec.ContainerID)
	return resource.Check("runsc_container_gone", ok, d)
}

// List reads runsc's state dir (no runsc process per container).
func (r runscResource) List(context.Context) ([]string, error) {
	return r.n.d.Runtime.Known()
}
func (runscResource) Name(rec journal.Sandbox) string { return resource.NameOf(rec) }
func (r runscResource) RemoveOrphan(ctx context.Context, cid string) error {
	_ = r.n.d.Runtime.Kill(ctx, cid, syscall.SIGKILL, true) // delete --force kills too; this is faster when it runs
	return r.n.d.Runtime.Delete(ctx, cid)
}
func (r runscResource) Survey(context.Context) (resource.Missing, error) {
	known, err := r.n.d.Runtime.Known()
	if err != nil {
		return nil, fmt.Errorf("list runsc containers: %w", err)
	}
	return missingUnless(resource.SetOf(known), resource.NameOf, "runsc container"), nil
}

// missingUnless is the Missing of a survey that found the objects named in
// set: what is gone when name(rec) is not among them.
func missingUnless(set map[string]bool, name func(journal.Sandbox) string, what string) resource.Missing {
	return func(_ context.Context, rec journal.Sandbox) string {
		if n := name(rec); n != "" && !set[n] {
			return what
		}
		return ""
	}
}
