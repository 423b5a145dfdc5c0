package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/resource"
)

// Reconcile runs once on taking over, before the API is served. It replays
// the journal against the kernel, which decides what exists:
//   - claims that were half done are rolled back (cleanup proof, operation failed);
//   - releases that were half done are completed (cleanup proof, operation done);
//   - ready generations whose container still runs are re-adopted as they are;
//     a generation whose writers alone died (its block root's, a volume's)
//     gets their next writers on the same devices (restartWriter); those whose container, lease, mount or
//     netns is gone (or whose writer could not be restarted) are marked lost
//     and cleaned up;
//   - effect records no live generation owns are finished (the object
//     removed, the record dropped); then, as a second line of defence,
//     kernel objects under ctld's names that no live generation owns are
//     removed and reported as unjournaled.
func (n *Node) Reconcile(ctx context.Context) error {
	// The exit watch starts with the term, not at its first claim: its
	// inotify descriptor belongs to the term (a claim and its release
	// leave ctld's descriptors as they found them).
	n.exitWatcher()
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
	// The node-wide network first (forwarding, the nft table), then the
	// DNS proxy answers again for every ready generation: both before any
	// teardown, so a failover is short for the guests that stay.
	var errs []error
	if err := n.net.Ensure(ctx); err != nil {
		errs = append(errs, err)
	}
	n.net.RegisterDNS(ss)
	// Take stock of the kernel once (runsc state dir, mountinfo) rather than
	// per sandbox: a takeover must not pay a runsc process or a mountinfo
	// parse per guest before it serves.
	t0 := time.Now()
	alive, err := n.survey(ctx)
	if err != nil {
		return err
	}
	tList := time.Since(t0)
	live := map[string]bool{}    // container ids of generations that stay
	var exited []journal.Sandbox // generations whose guest ended (exits.go)
	for _, s := range ss {
		log := n.log.With("sandbox", s.ID, "generation", s.Generation)
		switch s.State {
		case journal.StateClaiming:
			log.Info("rolling back a claim interrupted by failover")
			_, err := n.teardown(ctx, s, s.ClaimOp, journal.StateFailed, "claim interrupted by failover; rolled back")
			errs = append(errs, err)
			n.failPending(s.ClaimOp, errdefs.Errorf(errdefs.CodeUnavailable, "claim interrupted by failover of the primary; rolled back, retry with a new operation_id"))
		case journal.StateReleasing:
			log.Info("completing a release interrupted by failover")
			reason := "released"
			if s.Seal != nil && s.Seal.State == journal.SealPublished && s.Seal.OperationID == s.ReleaseOp {
				reason = "paused"
			}
			_, err := n.teardown(ctx, s, s.ReleaseOp, journal.StateReleased, reason)
			errs = append(errs, err)
		case journal.StateReady, journal.StateLost:
			if settled, release := n.settleSeal(ctx, s); release {
				log.Info("completing a pause interrupted by failover")
				_, err := n.teardown(ctx, settled, settled.ReleaseOp, journal.StateReleased, "paused")
				errs = append(errs, err)
				continue
			}
			if ex, ok := n.exitedUnwatched(ctx, s); ok {
				exited = append(exited, ex) // released (on_exit) once reconciled
				n.armExpiry(ex)             // on_exit keep: still ends at its max lifetime
				continue
			}
			missing := n.missing(ctx, s, alive)
			reason := fmt.Sprintf("lost: %v gone", missing)
			if s.State == journal.StateReady && len(missing) > 0 && !slices.ContainsFunc(missing, notWriter) {
				// Only writers died (the root's, a volume's): the next ones
				// re-attach their devices (writerwatch.go) and the guest
				// sees no error.
				var err error
				for _, vol := range n.deadWriters(ctx, s) {
					var rs journal.Sandbox
					if rs, err = n.restartWriter(ctx, s, vol, errors.New("writer found dead on takeover")); err != nil {
						break
					}
					s = rs
				}
				if err == nil {
					missing = nil
				} else if n.live() != nil {
					errs = append(errs, err)
					continue // the next primary decides
				} else {
					reason = fmt.Sprintf("lost: %v", err)
				}
			}
			if len(missing) > 0 || s.State == journal.StateLost {
				log.Warn("generation lost: kernel objects gone", "missing", missing, "reason", reason)
				n.setState(s.ID, journal.StateLost, reason)
				// Lost holds its capacity until the proof; a clean proof ends
				// it as released (the reason keeps that it was lost).
				_, err := n.teardown(ctx, s, "lost-"+s.ContainerID, journal.StateReleased, reason)
				errs = append(errs, err)
				continue
			}
			log.Info("re-adopted running generation", "container", s.ContainerID)
			live[s.ContainerID] = true
			errs = append(errs, n.net.RedoUpdate(ctx, s))
			n.armExpiry(s)
			n.watchExit(ctx, s)
		case journal.StateExited:
			exited = append(exited, s)
			n.armExpiry(s) // it holds capacity until released
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
	// Warm members before the carriers and the sweep: each is destroyed
	// with its cleanup proof (adoption is not built yet).
	errs = append(errs, n.destroyMembers(ctx))
	errs = append(errs, n.net.AdoptCarriers(ctx))
	errs = append(errs, n.removeOrphans(ctx))
	// Every takeover retries every withheld teardown once, whatever its
	// backoff: the obstacle may have gone with the previous primary.
	n.retryWithheld(ctx, "takeover", withheldIn(ss))
	n.net.StartCarriers() // after the sweep, so it never races a carrier being made
	n.startWarm()         // likewise a member being made
	for _, s := range exited {
		n.onExit(s) // an on_exit release a dead primary did not finish
	}
	n.log.Info("reconciled", "sandboxes", len(ss), "adopted", len(live), "inventory_ms", tList.Milliseconds(),
		"check_ms", tCheck.Milliseconds(), "orphans_ms", (time.Since(t0) - tList - tCheck).Milliseconds())
	return errors.Join(errs...)
}

// notWriter: a missing object (Node.missing) that is not a writer, so a
// writer's restart does not save the generation.
func notWriter(missing string) bool {
	return missing != "writer" && !strings.HasPrefix(missing, "volume writer ")
}

func (n *Node) failPending(opID string, cause *errdefs.Error) {
	err := n.d.Journal.Update(func(tx *journal.Tx) error {
		op, ok, err := tx.Operation(opID)
		if err != nil || !ok || op.State != journal.OpPending {
			return err
		}
		op.State, op.Error = journal.OpFailed, &journal.OpError{Code: cause.Code, Message: cause.Message}
		return tx.PutOperation(op)
	})
	if err != nil {
		n.log.Error("journal failed operation", "op", opID, "err", err)
	}
}

func (n *Node) setState(id string, state journal.State, reason string) {
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

// survey asks each liveness entry to read the kernel once (through the
// subsystems, not /proc directly, so a fake kernel can stand in).
func (n *Node) survey(ctx context.Context) (map[journal.Kind]resource.Missing, error) {
	out := map[journal.Kind]resource.Missing{}
	for _, r := range n.table.All() {
		if l, ok := r.(resource.Liveness); ok {
			m, err := l.Survey(ctx)
			if err != nil {
				return nil, err
			}
			out[r.Spec().Kind] = m
		}
	}
	return out, nil
}

// missing lists which of a ready generation's kernel objects are gone.
func (n *Node) missing(ctx context.Context, s journal.Sandbox, alive map[journal.Kind]resource.Missing) []string {
	var out []string
	for _, r := range slices.Backward(n.tableFor(s)) {
		if m := alive[r.Spec().Kind]; m != nil {
			if what := m(ctx, s); what != "" {
				out = append(out, what)
			}
		}
	}
	return out
}

// removeOrphans handles what no generation that stays owns (one still
// holding capacity or withheld, whose objects its own teardown or retry
// removes). First the journal: an effect record of any other generation
// (intended, done or removing) is finished, its object removed and the
// record dropped. Then the kernel: an object of a table kind under ctld's
// names that no such generation owns is removed too, and reported as
// unjournaled: the journal should have named it.
func (n *Node) removeOrphans(ctx context.Context) error {
	var keep []journal.Sandbox
	var effects []journal.Effect
	recs := map[string]journal.Sandbox{} // sandbox records the orphan effects name
	err := n.d.Journal.View(func(tx *journal.Tx) error {
		ss, err := tx.LiveSandboxes()
		if err != nil {
			return err
		}
		for _, s := range ss {
			if s.Holds() || s.Withheld {
				keep = append(keep, s)
			}
		}
		// Members destroyMembers could not prove gone keep their
		// objects and effect records for the next takeover's retry.
		ms, err := tx.WarmMembers()
		if err != nil {
			return err
		}
		for _, m := range ms {
			keep = append(keep, m.Rec)
		}
		if effects, err = tx.Effects(); err != nil {
			return err
		}
		for _, e := range effects {
			if s, ok, err := tx.Sandbox(e.SandboxID); err != nil {
				return err
			} else if ok {
				recs[e.SandboxID] = s
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("read journal: %w", err)
	}
	kept := map[string]bool{}                   // "sandbox/generation"
	owned := map[journal.Kind]map[string]bool{} // kind → names
	slots := map[uint32]bool{}                  // address slots of generations that stay
	for _, r := range n.table.All() {
		owned[r.Spec().Kind] = map[string]bool{}
	}
	for _, s := range keep {
		kept[genKey(s.ID, s.Generation)] = true
		if s.Slot != 0 {
			slots[s.Slot] = true
		}
		for _, r := range n.table.All() {
			if l, ok := r.(resource.Lister); ok {
				if name := l.Name(s); name != "" {
					owned[r.Spec().Kind][name] = true
				}
			}
		}
	}
	if err := n.net.CarriersOwned(owned, slots); err != nil {
		return err
	}
	rank := map[journal.Kind]int{}
	for i, r := range n.table.All() {
		rank[r.Spec().Kind] = i
	}
	// Reverse table order, as a teardown: the guest before its cgroup.
	slices.SortStableFunc(effects, func(a, b journal.Effect) int { return rank[b.Kind] - rank[a.Kind] })
	var errs []error
	for _, e := range effects {
		if kept[genKey(e.SandboxID, e.Generation)] {
			continue
		}
		r := n.table.Kind(e.Kind)
		if r == nil {
			errs = append(errs, fmt.Errorf("effect record %s/%s of an unknown kind: kept", e.Kind, e.Name))
			continue
		}
		rec, ok := recs[e.SandboxID]
		if !ok || rec.Generation != e.Generation {
			// The sandbox moved on (or a record from an older version):
			// the name is the generation's container id.
			rec = journal.Sandbox{}
			rec.ID, rec.Generation, rec.ContainerID, rec.LeaseID, rec.Slot = e.SandboxID, e.Generation, e.Name, e.Name, e.Slot
		}
		if rec.Slot != 0 && slots[rec.Slot] {
			// A generation that stays holds this slot now (a journal that
			// disagrees with itself): what is named by the slot is its,
			// never removed for another generation's record. Objects named
			// by this generation alone are left to the sweep below.
			n.log.Warn("effect record of a generation that is over names a slot a live generation holds: its slot's objects are kept", "kind", e.Kind, "name", e.Name, "slot", rec.Slot)
			rec.Slot = 0
		}
		if err := n.live(); err != nil {
			return errors.Join(append(errs, err)...)
		}
		n.log.Warn("finishing the effect record of a generation that is over", "kind", e.Kind, "name", e.Name, "state", e.State, "sandbox", e.SandboxID, "generation", e.Generation)
		n.crash("orphan:" + string(e.Kind))
		if err := r.Remove(ctx, rec); err != nil {
			errs = append(errs, fmt.Errorf("remove orphan %s %s: %w", e.Kind, e.Name, err))
			continue
		}
		if err := n.d.Journal.Update(func(tx *journal.Tx) error { return tx.DeleteEffect(e.Kind, e.Name) }); err != nil {
			errs = append(errs, fmt.Errorf("journal orphan %s %s removed: %w", e.Kind, e.Name, err))
		}
	}
	for _, r := range slices.Backward(n.table.All()) {
		l, ok := r.(resource.Lister)
		if !ok {
			continue
		}
		names, err := l.List(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("list %s: %w", r.Spec().Kind, err))
			continue
		}
		for _, name := range names {
			if owned[r.Spec().Kind][name] {
				continue
			}
			if err := n.live(); err != nil {
				return errors.Join(append(errs, err)...)
			}
			n.unjournaledFound(r.Spec().Kind, name, "orphan sweep")
			n.crash("orphan:" + string(r.Spec().Kind))
			if err := l.RemoveOrphan(ctx, name); err != nil {
				errs = append(errs, fmt.Errorf("remove orphan %s %s: %w", r.Spec().Kind, name, err))
			}
		}
	}
	return errors.Join(errs...)
}

func genKey(id string, gen uint64) string { return fmt.Sprintf("%s/%d", id, gen) }
