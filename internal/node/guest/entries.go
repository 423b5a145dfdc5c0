package guest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/resource"
	"github.com/ctld/ctld/internal/proof"
	"github.com/ctld/ctld/internal/runsc"
)

type logsResource struct {
	g *Guest
}

func (logsResource) Spec() resource.Spec {
	return resource.Spec{Kind: journal.KindLogs, Phase: resource.PhaseLease, Check: "logs_removed", Sweeps: true}
}
func (r logsResource) Make(_ context.Context, c *resource.Claim) error {
	if err := r.g.logDirs().Make(c.Rec.ContainerID); err != nil {
		return fmt.Errorf("make log dir: %w", err)
	}
	return nil
}
func (r logsResource) Remove(_ context.Context, rec journal.Sandbox) error {
	return r.g.logDirs().Remove(rec.ContainerID)
}
func (r logsResource) Gone(_ context.Context, rec journal.Sandbox) proof.Check {
	ok, d := r.g.logDirs().CheckGone(rec.ContainerID)
	return resource.Check("logs_removed", ok, d)
}
func (r logsResource) List(ctx context.Context) ([]string, error) {
	return r.g.listLogs(ctx)
}
func (logsResource) Name(rec journal.Sandbox) string { return resource.NameOf(rec) }
func (r logsResource) RemoveOrphan(_ context.Context, name string) error {
	return r.g.logDirs().Remove(name)
}

type cgroupResource struct{ g *Guest }

func (cgroupResource) Spec() resource.Spec {
	return resource.Spec{Kind: journal.KindCgroup, Phase: resource.PhaseLease, Check: "cgroup_removed", Sweeps: true}
}
func (r cgroupResource) Make(ctx context.Context, c *resource.Claim) error {
	if err := r.g.d.Leases.Create(ctx, LeaseSpec(c.Rec.ContainerID, c.Rec.Resources, r.g.cfg.BootCPUMillis, c.Rec.RuntimePIDs)); err != nil {
		return fmt.Errorf("create lease: %w", err)
	}
	return nil
}
func (r cgroupResource) Remove(ctx context.Context, rec journal.Sandbox) error {
	return r.g.d.Leases.Remove(ctx, rec.LeaseID)
}
func (r cgroupResource) Gone(ctx context.Context, rec journal.Sandbox) proof.Check {
	ok, d := r.g.d.Leases.CheckGone(ctx, rec.LeaseID)
	return resource.Check("cgroup_removed", ok, d)
}
func (r cgroupResource) List(ctx context.Context) ([]string, error) {
	return r.g.d.Leases.List(ctx)
}
func (cgroupResource) Name(rec journal.Sandbox) string { return rec.LeaseID }
func (r cgroupResource) RemoveOrphan(ctx context.Context, name string) error {
	return r.g.d.Leases.Remove(ctx, name)
}

// missing: the guest is alive while its lease cgroup is populated: runsc
// puts the sandbox and gofer processes there, and they die together.
func (r cgroupResource) Survey(context.Context) (resource.Missing, error) {
	return func(ctx context.Context, rec journal.Sandbox) string {
		if alive, err := r.g.d.Leases.Populated(ctx, rec.LeaseID); err != nil || !alive {
			return "guest processes"
		}
		return ""
	}, nil
}

// bundleResource is the OCI bundle (config.json) runsc is created from.
type bundleResource struct {
	g *Guest
}

func (bundleResource) Spec() resource.Spec {
	return resource.Spec{Kind: journal.KindBundle, Phase: resource.PhaseGuest, Check: "bundle_removed", Sweeps: true}
}
func (r bundleResource) Make(_ context.Context, c *resource.Claim) error {
	rec, req := c.Rec, c.Rec.Request
	args := req.Process.Args
	if len(args) == 0 {
		args = r.g.cfg.DefaultArgs
	}
	// The guest's resolv.conf lives in the bundle: it goes with it.
	var resolv string
	ns, err := r.g.d.Nameservers.Nameservers(rec)
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
	b := runsc.BundleSpec{
		ContainerID: rec.ContainerID, RootPath: c.Root, Hostname: rec.ID, NetnsPath: c.NSPath,
		CgroupsPath: r.g.d.Leases.CgroupsPath(rec.LeaseID), CPUMillis: req.Resources.CPUMillis,
		MemoryBytes: req.Resources.MemoryBytes, PIDs: rec.Resources.PIDs + rec.RuntimePIDs,
		Args: args, Env: req.Process.Env, Cwd: req.Process.Cwd, UID: req.Process.UID, GID: req.Process.GID,
		OOMScoreAdj: r.g.cfg.GuestOOMScoreAdj, ResolvConf: resolv, Agent: r.g.agentSpec(rec),
		Binds: c.Binds,
	}
	if rec.Warm {
		// A warm pool member: the warm agent alone, a neutral hostname;
		// the claim brings the workload, its user, env, cwd and hostname
		// (WarmClaim).
		b.Args, b.Env, b.Cwd, b.UID, b.GID, b.Hostname = nil, nil, "", 0, 0, WarmHostname
		b.Agent.Warm = true
	}
	oci, err := runsc.BuildSpec(b)
	if err != nil {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "build OCI spec: %v", err)
	}
	if err := runsc.WriteBundle(rec.Bundle, oci); err != nil {
		return fmt.Errorf("write bundle: %w", err)
	}
	return nil
}
func (r bundleResource) Remove(_ context.Context, rec journal.Sandbox) error {
	return os.RemoveAll(r.g.bundleDir(rec.ContainerID))
}
func (r bundleResource) Gone(_ context.Context, rec journal.Sandbox) proof.Check {
	return resource.PathGone("bundle_removed", r.g.bundleDir(rec.ContainerID))
}
func (r bundleResource) List(context.Context) ([]string, error) {
	return resource.DirEntries(filepath.Join(r.g.cfg.RunDir, "bundles"))
}

func (bundleResource) Name(rec journal.Sandbox) string { return resource.NameOf(rec) }
func (r bundleResource) RemoveOrphan(_ context.Context, name string) error {
	return os.RemoveAll(r.g.bundleDir(name))
}

// runscResource is the guest: runsc's container (sandbox, gofer, state).
type runscResource struct{ g *Guest }

func (runscResource) Spec() resource.Spec {
	return resource.Spec{Kind: journal.KindRunsc, Phase: resource.PhaseGuest, Check: "runsc_container_gone", Sweeps: true}
}
func (r runscResource) Make(ctx context.Context, c *resource.Claim) error {
	cid := c.Rec.ContainerID
	if err := r.g.runscStep(ctx, c.Rec, "create", func(ctx context.Context) error {
		return r.g.d.Runtime.Create(ctx, cid, c.Rec.Bundle)
	}); err != nil {
		return fmt.Errorf("start container: %w", err)
	}
	if err := r.g.runscStep(ctx, c.Rec, "start", func(ctx context.Context) error {
		return r.g.d.Runtime.Start(ctx, cid)
	}); err != nil {
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
	if err := r.g.d.Leases.Kill(ctx, rec.LeaseID); err != nil {
		r.g.log.Warn("kill the guest through its lease failed; runsc kills it", "sandbox", rec.ID, "generation", rec.Generation, "err", err)
		return r.RemoveOrphan(ctx, rec.ContainerID)
	}
	return r.g.d.Runtime.Delete(ctx, rec.ContainerID)
}
func (r runscResource) Gone(ctx context.Context, rec journal.Sandbox) proof.Check {
	ok, d := r.g.d.Runtime.CheckGone(ctx, rec.ContainerID)
	return resource.Check("runsc_container_gone", ok, d)
}

// List reads runsc's state dir (no runsc process per container).
func (r runscResource) List(context.Context) ([]string, error) {
	return r.g.d.Runtime.Known()
}
func (runscResource) Name(rec journal.Sandbox) string { return resource.NameOf(rec) }
func (r runscResource) RemoveOrphan(ctx context.Context, cid string) error {
	_ = r.g.d.Runtime.Kill(ctx, cid, syscall.SIGKILL, true) // delete --force kills too; this is faster when it runs
	return r.g.d.Runtime.Delete(ctx, cid)
}
func (r runscResource) Survey(context.Context) (resource.Missing, error) {
	known, err := r.g.d.Runtime.Known()
	if err != nil {
		return nil, fmt.Errorf("list runsc containers: %w", err)
	}
	return resource.MissingUnless(resource.SetOf(known), resource.NameOf, "runsc container"), nil
}
