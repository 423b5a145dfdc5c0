package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/mountinfo"
	"github.com/ctld/ctld/internal/node/journal"
)

// Reconcile runs once on taking over, before the API is served. It replays
// the journal against the kernel, which decides what exists:
//   - claims that were half done are rolled back (cleanup proof, operation failed);
//   - releases that were half done are completed (cleanup proof, operation done);
//   - ready generations whose container still runs are re-adopted as they are;
//     those whose container, lease, mount or netns is gone are marked lost and
//     cleaned up;
//   - kernel objects under ctld's names that no live generation owns are
//     orphans and removed; effect records of objects that never appeared are
//     dropped.
func (n *Node) Reconcile(ctx context.Context) error {
	var ss []journal.Sandbox
	var ops []journal.Operation
	if err := n.d.Journal.View(func(tx *journal.Tx) (err error) {
		if ss, err = tx.LiveSandboxes(); err != nil {
			return err
		}
		ops, err = tx.PendingOperations()
		return err
	}); err != nil {
		return fmt.Errorf("read journal: %w", err)
	}
	// Take stock of the kernel once (runsc state dir, mountinfo) rather than
	// per sandbox: a takeover must not pay a runsc process or a mountinfo
	// parse per guest before it serves.
	t0 := time.Now()
	inv, err := n.inventory()
	if err != nil {
		return err
	}
	tList := time.Since(t0)
	var errs []error
	live := map[string]bool{} // container ids of generations that stay
	for _, s := range ss {
		log := n.log.With("sandbox", s.ID, "generation", s.Generation)
		switch s.State {
		case api.StateClaiming:
			log.Info("rolling back a claim interrupted by failover")
			_, err := n.teardown(ctx, s, s.ClaimOp, api.StateFailed, "claim interrupted by failover; rolled back")
			errs = append(errs, err)
			n.failPending(s.ClaimOp, errdefs.Errorf(errdefs.CodeUnavailable, "claim interrupted by failover of the primary; rolled back, retry with a new operation_id"))
		case api.StateReleasing:
			log.Info("completing a release interrupted by failover")
			_, err := n.teardown(ctx, s, s.ReleaseOp, api.StateReleased, "released")
			errs = append(errs, err)
		case api.StateReady, api.StateLost:
			if missing := n.missing(ctx, s, inv); len(missing) > 0 || s.State == api.StateLost {
				log.Warn("generation lost: kernel objects gone", "missing", missing)
				n.setState(s.ID, api.StateLost, fmt.Sprintf("lost: %v gone", missing))
				// Lost holds its capacity until the proof; a clean proof ends
				// it as released (the reason keeps that it was lost).
				_, err := n.teardown(ctx, s, "lost-"+s.ContainerID, api.StateReleased, fmt.Sprintf("lost: %v gone", missing))
				errs = append(errs, err)
				continue
			}
			log.Info("re-adopted running generation", "container", s.ContainerID)
			live[s.ContainerID] = true
			n.armExpiry(s)
		}
	}
	// Operations pending without a sandbox in flight (e.g. a claim refused
	// inside its own transaction never got this far) cannot exist; any other
	// pending one was resolved above. Fail leftovers so retries get an answer.
	for _, op := range ops {
		if op.State == journal.OpPending {
			n.failPending(op.ID, errdefs.Errorf(errdefs.CodeUnavailable, "operation interrupted by failover of the primary"))
		}
	}
	tCheck := time.Since(t0) - tList
	errs = append(errs, n.removeOrphans(ctx, live, inv.containers))
	errs = append(errs, n.sweepDiskProjects(ctx))
	// Every takeover retries every withheld teardown once, whatever its
	// backoff: the obstacle may have gone with the previous primary.
	n.retryWithheld(ctx, "takeover", withheldIn(ss))
	n.log.Info("reconciled", "sandboxes", len(ss), "adopted", len(live), "inventory_ms", tList.Milliseconds(),
		"check_ms", tCheck.Milliseconds(), "orphans_ms", (time.Since(t0) - tList - tCheck).Milliseconds())
	return errors.Join(errs...)
}

func (n *Node) failPending(opID string, cause *errdefs.Error) {
	err := n.d.Journal.Update(func(tx *journal.Tx) error {
		op, ok, err := tx.Operation(opID)
		if err != nil || !ok || op.State != journal.OpPending {
			return err
		}
		op.State, op.Error = journal.OpFailed, &api.ErrorBody{Code: cause.Code, Message: cause.Message}
		return tx.PutOperation(op)
	})
	if err != nil {
		n.log.Error("journal failed operation", "op", opID, "err", err)
	}
}

func (n *Node) setState(id, state, reason string) {
	err := n.d.Journal.Update(func(tx *journal.Tx) error {
		s, ok, err := tx.Sandbox(id)
		if err != nil || !ok {
			return err
		}
		s.State, s.Reason = state, reason
		return tx.PutSandbox(s)
	})
	if err != nil {
		n.log.Error("journal sandbox state", "sandbox", id, "err", err)
	}
}

// kernelInventory is what exists, read once per reconcile.
type kernelInventory struct {
	containers []string        // containers with runsc state under the runsc root
	mounted    map[string]bool // mount points
}

func (n *Node) inventory() (kernelInventory, error) {
	var inv kernelInventory
	var err error
	if inv.containers, err = n.d.Runtime.Known(); err != nil {
		return inv, fmt.Errorf("list runsc containers: %w", err)
	}
	ms, err := mountinfo.ReadFile(mountinfo.SelfPath)
	if err != nil {
		return inv, fmt.Errorf("read mountinfo: %w", err)
	}
	inv.mounted = make(map[string]bool, len(ms))
	for _, m := range ms {
		inv.mounted[m.MountPoint] = true
	}
	return inv, nil
}

// missing lists which of a ready generation's kernel objects are gone. The
// guest is alive while its lease cgroup is populated: runsc puts the
// sandbox and gofer processes there, and they die together.
func (n *Node) missing(ctx context.Context, s journal.Sandbox, inv kernelInventory) []string {
	var out []string
	if !slices.Contains(inv.containers, s.ContainerID) {
		out = append(out, "runsc container")
	}
	if alive, err := n.d.Leases.Populated(ctx, s.LeaseID); err != nil || !alive {
		out = append(out, "guest processes")
	}
	if !inv.mounted[s.Root] {
		out = append(out, "rootfs mount")
	}
	if !inv.mounted[n.d.Netns.Path(s.ContainerID)] {
		out = append(out, "netns")
	}
	return out
}

// removeOrphans removes ctld-named kernel objects no live generation owns,
// and forgets effect records of objects that are gone.
func (n *Node) removeOrphans(ctx context.Context, live map[string]bool, containers []string) error {
	var errs []error
	sweep := func(kind string, list func(context.Context) ([]string, error), remove func(context.Context, string) error) {
		names, err := list(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("list %s: %w", kind, err))
			return
		}
		for _, name := range names {
			if live[name] {
				continue
			}
			if err := n.live(); err != nil {
				errs = append(errs, err)
				return
			}
			n.log.Warn("removing orphan", "kind", kind, "name", name)
			if err := remove(ctx, name); err != nil {
				errs = append(errs, fmt.Errorf("remove orphan %s %s: %w", kind, name, err))
			}
		}
	}
	known := func(context.Context) ([]string, error) { return containers, nil }
	sweep(journal.KindRunsc, known, func(ctx context.Context, id string) error {
		_ = n.d.Runtime.Kill(ctx, id, syscall.SIGKILL, true)
		return n.d.Runtime.Delete(ctx, id)
	})
	sweep(journal.KindBundle, n.listBundles, func(_ context.Context, cid string) error { return os.RemoveAll(n.bundleDir(cid)) })
	sweep(journal.KindNetns, n.d.Netns.List, n.d.Netns.Delete)
	sweep(journal.KindMount, n.d.RootFS.List, n.d.RootFS.Unmount)
	sweep(journal.KindCgroup, n.d.Leases.List, n.d.Leases.Remove)
	sweep(journal.KindLogs, n.listLogs, n.removeLogs) // after the cgroups: no log writer left

	err := n.d.Journal.Update(func(tx *journal.Tx) error {
		effects, err := tx.Effects()
		if err != nil {
			return err
		}
		for _, e := range effects {
			if !live[e.Name] {
				if err := tx.DeleteEffect(e.Kind, e.Name); err != nil {
					return err
				}
			}
		}
		return nil
	})
	errs = append(errs, err)
	return errors.Join(errs...)
}

func (n *Node) listBundles(context.Context) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(n.cfg.RunDir, "bundles"))
	if os.IsNotExist(err) {
		return nil, nil
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	slices.Sort(out)
	return out, err
}
