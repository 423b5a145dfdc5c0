package node

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/node/journal"
	"github.com/ctld/ctld/internal/runtime"
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
		if ss, err = tx.Sandboxes(); err != nil {
			return err
		}
		ops, err = tx.Operations()
		return err
	}); err != nil {
		return fmt.Errorf("read journal: %w", err)
	}
	// One `runsc list` for all guests: a takeover must not pay a runsc
	// call per sandbox before it serves.
	states, err := n.d.Runtime.States(ctx)
	if err != nil {
		return fmt.Errorf("list runsc containers: %w", err)
	}
	var errs []error
	live := map[string]bool{} // container ids of generations that stay
	for _, s := range ss {
		log := n.log.With("sandbox", s.ID, "generation", s.Generation)
		switch s.State {
		case api.StateClaiming:
			log.Info("rolling back a claim interrupted by failover")
			_, err := n.teardown(ctx, s, s.ClaimOp, api.StateFailed, "claim interrupted by failover; rolled back")
			errs = append(errs, err)
			n.failPending(s.ClaimOp, api.Errorf(api.CodeUnavailable, "claim interrupted by failover of the primary; rolled back, retry with a new operation_id"))
		case api.StateReleasing:
			log.Info("completing a release interrupted by failover")
			_, err := n.teardown(ctx, s, s.ReleaseOp, api.StateReleased, "released")
			errs = append(errs, err)
		case api.StateReady, api.StateLost:
			if missing := n.missing(ctx, s, states); len(missing) > 0 || s.State == api.StateLost {
				log.Warn("generation lost: kernel objects gone", "missing", missing)
				n.setState(s.ID, api.StateLost, fmt.Sprintf("lost: %v gone", missing))
				_, err := n.teardown(ctx, s, "lost-"+s.ContainerID, api.StateLost, fmt.Sprintf("lost: %v gone", missing))
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
			n.failPending(op.ID, api.Errorf(api.CodeUnavailable, "operation interrupted by failover of the primary"))
		}
	}
	errs = append(errs, n.removeOrphans(ctx, live, states))
	return errors.Join(errs...)
}

func (n *Node) failPending(opID string, cause *api.Error) {
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

// missing lists which of a ready generation's kernel objects are gone.
func (n *Node) missing(ctx context.Context, s journal.Sandbox, states map[string]runtime.State) []string {
	var out []string
	if st, ok := states[s.ContainerID]; !ok || st.Status != "running" {
		out = append(out, "runsc container")
	}
	if gone, _ := n.d.Leases.CheckGone(ctx, s.LeaseID); gone {
		out = append(out, "cgroup")
	}
	if gone, _ := n.d.RootFS.CheckGone(ctx, s.ContainerID); gone {
		out = append(out, "rootfs mount")
	}
	if gone, _ := n.d.Netns.CheckGone(ctx, s.ContainerID); gone {
		out = append(out, "netns")
	}
	return out
}

// removeOrphans removes ctld-named kernel objects no live generation owns,
// and forgets effect records of objects that are gone.
func (n *Node) removeOrphans(ctx context.Context, live map[string]bool, states map[string]runtime.State) error {
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
			n.log.Warn("removing orphan", "kind", kind, "name", name)
			if err := remove(ctx, name); err != nil {
				errs = append(errs, fmt.Errorf("remove orphan %s %s: %w", kind, name, err))
			}
		}
	}
	containers := func(context.Context) ([]string, error) {
		return slices.Sorted(maps.Keys(states)), nil
	}
	sweep(journal.KindRunsc, containers, func(ctx context.Context, id string) error {
		_ = n.d.Runtime.Kill(ctx, id, syscall.SIGKILL, true)
		return n.d.Runtime.Delete(ctx, id)
	})
	sweep(journal.KindBundle, n.listBundles, func(_ context.Context, cid string) error { return os.RemoveAll(n.bundleDir(cid)) })
	sweep(journal.KindNetns, n.d.Netns.List, n.d.Netns.Delete)
	sweep(journal.KindMount, n.d.RootFS.List, n.d.RootFS.Unmount)
	sweep(journal.KindCgroup, n.d.Leases.List, n.d.Leases.Remove)

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
