package network

import (
	"context"
	"errors"
	"fmt"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/netpolicy"
	"github.com/ctld/ctld/internal/node/op"
)

// UpdateCrashPoints are a live update's crash points, in order.
func UpdateCrashPoints() []string {
	return []string{"netupdate:intended", "netupdate:applied", "netupdate:done"}
}

// Update replaces the network policy of the sandbox's running
// generation (a live update, docs/network-design.md §6), without
// restarting its guest: the new policy is journaled as intended on the
// generation's record, applied in one nft transaction (the old policy or
// the new one holds, never a mix; the DNS proxy learns it just before),
// the flows it no longer allows are cut, and the record says it is done. A crash in
// between leaves the update intended; the next primary's reconcile does
// it again (each step is idempotent). Setting the policy in force again
// changes nothing. It returns the generation's record as updated.
func (n *Net) Update(ctx context.Context, id string, want journal.NetworkPolicy) (journal.Sandbox, error) {
	pol, err := n.Parse(want)
	if err != nil {
		return journal.Sandbox{}, err
	}
	ctx, done, err := n.d.Term.Begin(ctx)
	if err != nil {
		return journal.Sandbox{}, err
	}
	defer done()
	// One update of a sandbox at a time, and none while its release
	// starts (Release takes the same lock to move it out of ready).
	unlock := n.d.Locks.Lock(id)
	defer unlock()
	s, err := n.d.Ready(id)
	if err != nil {
		return journal.Sandbox{}, err
	}
	cur, err := n.Parse(policyOf(s))
	if err == nil && s.NetworkUpdate == nil && cur.Equal(pol) {
		return s, nil
	}
	if err := n.Check(pol); err != nil {
		return journal.Sandbox{}, err
	}
	o, ok, err := n.owner(s)
	if err != nil || !ok || !n.hasNet() {
		// A generation claimed before this node had its network (or
		// without a slot) has no veth or chain to change.
		return journal.Sandbox{}, errdefs.Errorf(errdefs.CodeConflict, "sandbox %s generation %d has no sandbox network to update (%v); release it and claim a new generation", id, s.Generation, orNoSlot(err, s))
	}
	if err := n.d.Term.Live(); err != nil {
		return journal.Sandbox{}, fmt.Errorf("network update of %s: %w", id, err)
	}
	err = n.d.Run.J.Update(func(tx *journal.Tx) error {
		cur, ok, err := tx.Sandbox(id)
		if err != nil {
			return err
		}
		if !ok || cur.Generation != s.Generation || cur.State != journal.StateReady {
			return errdefs.Errorf(errdefs.CodeConflict, "sandbox %s generation %d is no longer ready", id, s.Generation)
		}
		cur.NetworkUpdate = &journal.NetworkUpdate{Policy: want}
		s = cur
		return tx.PutSandbox(cur)
	})
	if err != nil {
		return journal.Sandbox{}, op.TxErr("journal network update of "+id, err)
	}
	n.d.Run.Crash("netupdate:intended")
	return n.applyUpdate(ctx, s, o, pol)
}

// applyUpdate makes the kernel enforce s's intended update and journals
// it done: the DNS proxy first, then nft (one transaction), then the cut
// of the flows it no longer allows. Reconcile calls it for an update a
// crash left intended.
func (n *Net) applyUpdate(ctx context.Context, s journal.Sandbox, o netpolicy.Owner, pol netpolicy.Policy) (journal.Sandbox, error) {
	log := n.log.With("sandbox", s.ID, "generation", s.Generation)
	eff := n.effective(o, pol)
	if err := n.d.Term.Live(); err != nil {
		return s, fmt.Errorf("network update of %s: %w", s.ID, err)
	}
	// The proxy answers by the new policy before nft applies it: Register
	// returns after the old entry's last set addition, so no answer of a
	// name the update removes lands in a set after the apply emptied it
	// (where it would stay until its timeout, its flows not cut).
	if n.has.dns {
		n.d.DNSProxy.Register(o, eff)
	}
	if err := n.d.Firewall.Apply(ctx, o, eff); err != nil {
		// Apply is one transaction: the old policy still holds. Forget
		// the intent, so the record says what the kernel enforces, and
		// give the proxy the old policy back.
		log.Warn("network update not applied; the old policy holds", "err", err)
		prev := s
		prev.NetworkUpdate = nil
		if old, perr := n.Parse(policyOf(prev)); perr == nil && n.has.dns {
			n.d.DNSProxy.Register(o, n.effective(o, old))
		}
		if jerr := n.endUpdate(s, false); jerr != nil {
			err = errors.Join(err, jerr)
		}
		return s, errdefs.Errorf(errdefs.CodeUnavailable, "apply network policy of %s: %v; the old policy holds", s.ID, err)
	}
	n.d.Run.Crash("netupdate:applied")
	if err := n.d.Term.Live(); err != nil {
		return s, fmt.Errorf("network update of %s: %w", s.ID, err)
	}
	cut, err := n.d.Flows.Cut(ctx, o.Block.Slot, eff)
	if err != nil {
		// The new policy holds for new flows; open ones it no longer
		// allows may live on: the update stays intended, so a retry (or
		// the next primary) cuts them.
		return s, errdefs.Errorf(errdefs.CodeUnavailable, "cut the flows the new policy of %s no longer allows: %v; retry the update", s.ID, err)
	}
	if err := n.endUpdate(s, true); err != nil {
		return s, fmt.Errorf("journal network update of %s done: %w", s.ID, err)
	}
	n.d.Run.Crash("netupdate:done")
	log.Info("network policy updated", "mode", eff.Mode, "flows_cut", cut)
	s.Network, s.NetworkUpdate = &s.NetworkUpdate.Policy, nil
	return s, nil
}

// endUpdate journals s's intended update as done (the policy in force) or
// as abandoned.
func (n *Net) endUpdate(s journal.Sandbox, done bool) error {
	return n.d.Run.J.Update(func(tx *journal.Tx) error {
		cur, ok, err := tx.Sandbox(s.ID)
		if err != nil || !ok || cur.Generation != s.Generation || cur.NetworkUpdate == nil {
			return err
		}
		if done {
			p := cur.NetworkUpdate.Policy
			cur.Network = &p
		}
		cur.NetworkUpdate = nil
		return tx.PutSandbox(cur)
	})
}

// RedoUpdate finishes, on takeover, an update a crash left intended on a
// ready generation that stays.
func (n *Net) RedoUpdate(ctx context.Context, s journal.Sandbox) error {
	if s.NetworkUpdate == nil {
		return nil
	}
	o, ok, err := n.owner(s)
	if err == nil && (!ok || !n.has.veth || !n.has.flows) {
		err = errors.New("this node has no sandbox network for it")
	}
	pol, perr := n.Parse(s.NetworkUpdate.Policy)
	if err == nil {
		err = perr
	}
	if err != nil {
		n.log.Error("network update left by the previous primary cannot be applied; the old policy holds", "sandbox", s.ID, "generation", s.Generation, "err", err)
		return errors.Join(fmt.Errorf("network update of %s: %w", s.ID, err), n.endUpdate(s, false))
	}
	n.log.Info("redoing a network update interrupted by failover", "sandbox", s.ID, "generation", s.Generation)
	_, err = n.applyUpdate(ctx, s, o, pol)
	return err
}

// Status is a generation's network as the node enforces it: its mode
// and its nft chain's counters (zero unless it runs).
type Status struct {
	Mode netpolicy.Mode
	netpolicy.Counters
}

// Status is the generation's mode and counters, when it has a sandbox
// network (nil: none; the counters only while it runs).
func (n *Net) Status(ctx context.Context, s journal.Sandbox) *Status {
	if s.Slot == 0 {
		return nil
	}
	mode := netpolicy.ModeDenyAll
	if pol, err := n.Parse(policyOf(s)); err == nil {
		mode = pol.Mode
	}
	st := &Status{Mode: mode}
	if s.State != journal.StateReady || !n.has.veth {
		return st
	}
	if o, ok, err := n.owner(s); err == nil && ok {
		if c, err := n.d.Firewall.Counters(ctx, o); err == nil {
			st.Counters = c
		}
	}
	return st
}
