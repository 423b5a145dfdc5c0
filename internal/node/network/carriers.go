package network

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/netpolicy"
	"github.com/ctld/ctld/internal/node/resource"
)

// Warm network carriers (docs/network-design.md §8): a pool of ready
// netns + veth + address slot, made in the background, so a claim takes
// one in its admitting transaction and only applies its policy. Until a
// claim takes it a carrier's link has no dispatch element in the nft
// table, so the base chain drops everything it sends (deny-all).
//
// A carrier is journaled by its own record (journal.Carrier), which is
// also its effect record: making before its netns and veth exist, ready
// after, removing before they are removed. It holds its slot (allocSlot
// skips it) and no lease. A claim that takes it deletes the record and,
// in the same transaction, writes the generation's netns and links effect
// records as done, with the slot and the carrier's netns in the sandbox
// record: from then on the generation owns them and its teardown removes
// them. A carrier is single-use: nothing ever gives one back to the pool.
//
// A takeover adopts the ready carriers whose netns and link exist and
// destroys the others (half made, half removed, or broken); the orphan
// sweep keeps what carrier records name and removes unjournaled ones like
// any other ctld-named netns or link.

// CarrierID is the owner id of a carrier's link: its alias is
// "carrier-g<slot>" (netpolicy.Owner.Alias), so `ip link` tells a
// carrier from a generation's link.
const CarrierID = "carrier"

// CarrierNetns is the netns name of the carrier on slot (the file is
// /run/netns/ctld-c<slot>): no generation's netns is named so, theirs all
// contain "-g".
func CarrierNetns(slot uint32) string { return fmt.Sprintf("c%05x", slot) }

// CarrierCrashPoints are the crash points of a carrier's life (Deps.Crash),
// apart from CrashPoints: a carrier is no generation.
func CarrierCrashPoints() []string {
	return []string{"carrier:intended", "carrier:made", "carrier:done", "carrier:removing", "carrier:removed"}
}

// warmPool is the node's state of the carrier pool; its zero value is
// ready to use.
type warmPool struct {
	fill    sync.Mutex // one filler at a time
	once    sync.Once
	kickCh  chan struct{}
	started bool

	mu      sync.Mutex
	changed chan struct{} // closed when a carrier's making or removal ends
}

// changes returns a channel closed when the next carrier's making or
// removal ends. A claim takes it before its admitting transaction, so
// no end after that transaction's view is missed.
func (w *warmPool) changes() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.changed == nil {
		w.changed = make(chan struct{})
	}
	return w.changed
}

// signal wakes the claims waiting in changes.
func (w *warmPool) signal() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.changed != nil {
		close(w.changed)
		w.changed = nil
	}
}

// ErrCarrierMaking marks a claim refused only because a carrier is being
// made on the last free address block: the claim waits for it
// (Config.CarrierWait) and tries again, so the pool never keeps a claim
// out.
var ErrCarrierMaking = errors.New("a warm carrier is being made on the last free address block")

// DefaultCarrierWait is Deps.CarrierWait's default: a carrier is made
// in milliseconds, seconds on a loaded host.
const DefaultCarrierWait = 10 * time.Second

// CarrierWait bounds how long a claim waits for a warm carrier being made
// on the last free address block.
func (n *Net) CarrierWait() time.Duration {
	if n.d.CarrierWait > 0 {
		return n.d.CarrierWait
	}
	return DefaultCarrierWait
}

// CarrierChanges returns a channel closed when the next carrier's making
// or removal ends (warmPool.changes).
func (n *Net) CarrierChanges() <-chan struct{} { return n.warm.changes() }

func (w *warmPool) ch() chan struct{} {
	w.once.Do(func() { w.kickCh = make(chan struct{}, 1) })
	return w.kickCh
}

// carriersOn reports whether this node keeps a pool of warm carriers.
func (n *Net) carriersOn() bool { return n.d.Carriers > 0 && n.hasNet() }

// KickCarriers asks the filler to top the pool up (never blocks).
func (n *Net) KickCarriers() {
	if !n.carriersOn() {
		return
	}
	select {
	case n.warm.ch() <- struct{}{}:
	default:
	}
}

// StartCarriers starts the term's filler once: it tops the pool up on
// each kick until the term ends. Each round is an operation of the term,
// so Drain waits for it.
func (n *Net) StartCarriers() {
	if !n.carriersOn() {
		return
	}
	n.mu.Lock()
	started := n.warm.started
	n.warm.started = true
	n.mu.Unlock()
	if started {
		return
	}
	kick := n.warm.ch()
	go func() {
		for {
			select {
			case <-n.d.Term.Context().Done():
				return
			case <-kick:
			}
			if !n.fillRound() {
				return // draining: the term is over
			}
		}
	}()
	n.KickCarriers()
}

// fillRound is one round of the filler, as an operation of the term; it
// reports false once the term is over.
func (n *Net) fillRound() bool {
	ctx, done, err := n.d.Term.Begin(context.Background())
	if err != nil {
		return false
	}
	defer done()
	if err := n.fillCarriers(ctx); err != nil && n.d.Term.Live() == nil {
		n.log.Warn("warm carriers: refill stopped", "err", err)
	}
	return true
}

// fillCarriers makes carriers until the pool has Config.Carriers of them
// (made or being made) or the address pool has no free slot: carriers
// never take a slot a claim could not get back (a claim takes a carrier
// before it allocates a slot).
func (n *Net) fillCarriers(ctx context.Context) error {
	if !n.carriersOn() {
		return nil
	}
	n.warm.fill.Lock()
	defer n.warm.fill.Unlock()
	for {
		if err := n.d.Term.Live(); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		c, ok, err := n.newCarrier()
		if err != nil || !ok {
			return err
		}
		if err := n.makeCarrier(ctx, c); err != nil {
			if n.d.Term.Live() != nil {
				return err // the next primary destroys it
			}
			n.log.Warn("warm carrier could not be made; destroying it", "slot", c.Slot, "err", err)
			return errors.Join(err, n.destroyCarrier(ctx, c))
		}
	}
}

// newCarrier journals the next carrier as making, on the lowest slot no
// generation and no carrier holds; ok is false when the pool is full or
// no slot is free.
func (n *Net) newCarrier() (c journal.Carrier, ok bool, err error) {
	err = n.d.Run.J.Update(func(tx *journal.Tx) error {
		cs, err := tx.Carriers()
		if err != nil {
			return err
		}
		pending := 0
		for _, c := range cs {
			if c.State != journal.CarrierRemoving {
				pending++
			}
		}
		if pending >= n.d.Carriers {
			n.log.Debug("warm carriers: pool full", "carriers", pending)
			return nil
		}
		live, err := tx.Holders() // a warm member's slot is held too
		if err != nil {
			return err
		}
		slot, err := n.allocSlot(live, carrierSlots(cs)...)
		if err != nil {
			n.log.Debug("warm carriers: no free address slot", "err", err)
			return nil
		}
		c = journal.Carrier{Slot: slot, Netns: CarrierNetns(slot), State: journal.CarrierMaking, Epoch: n.d.Run.Epoch}
		ok = true
		return tx.PutCarrier(c)
	})
	if err != nil {
		return c, false, fmt.Errorf("journal a new carrier: %w", err)
	}
	return c, ok, nil
}

func carrierSlots(cs []journal.Carrier) []netpolicy.Slot {
	out := make([]netpolicy.Slot, 0, len(cs))
	for _, c := range cs {
		out = append(out, netpolicy.Slot(c.Slot))
	}
	return out
}

func (n *Net) carrierOwner(slot uint32) (netpolicy.Owner, error) {
	b, err := n.d.Pool.Block(netpolicy.Slot(slot))
	if err != nil {
		return netpolicy.Owner{}, fmt.Errorf("address block of carrier %d: %w", slot, err)
	}
	return netpolicy.Owner{ID: CarrierID, Generation: uint64(slot), Block: b}, nil
}

// makeCarrier makes a journaled (making) carrier's netns and veth and
// journals it ready, unless a claim or a takeover changed its record
// meanwhile.
func (n *Net) makeCarrier(ctx context.Context, c journal.Carrier) error {
	defer n.warm.signal()
	n.d.Run.Crash("carrier:intended")
	if err := n.d.Term.Live(); err != nil {
		return err
	}
	o, err := n.carrierOwner(c.Slot)
	if err != nil {
		return err
	}
	path, err := n.d.Netns.Create(ctx, c.Netns)
	if err != nil {
		return fmt.Errorf("carrier %d: create netns: %w", c.Slot, err)
	}
	if err := n.d.Links.Make(ctx, o, path); err != nil {
		return fmt.Errorf("carrier %d: make veth: %w", c.Slot, err)
	}
	n.d.Run.Crash("carrier:made")
	if id, err := n.d.Netns.Identify(ctx, c.Netns); err == nil {
		c.NetnsDev, c.NetnsIno, c.NetnsCookie = id.Dev, id.Ino, id.Cookie
	}
	if err := n.d.Term.Live(); err != nil {
		return err
	}
	c.State = journal.CarrierReady
	err = n.d.Run.J.Update(func(tx *journal.Tx) error {
		cur, ok, err := tx.Carrier(c.Slot)
		if err != nil || !ok || cur.State != journal.CarrierMaking {
			return errors.Join(err, fmt.Errorf("carrier %d is no longer being made", c.Slot))
		}
		return tx.PutCarrier(c)
	})
	if err != nil {
		return fmt.Errorf("journal carrier %d ready: %w", c.Slot, err)
	}
	n.d.Run.Crash("carrier:done")
	n.log.Debug("warm carrier made", "slot", c.Slot, "netns", c.Netns)
	return nil
}

// destroyCarrier removes a carrier's veth and netns (journaled as
// removing first) and forgets it once both are proven gone; otherwise its
// record stays, and with it its slot, for the next takeover.
func (n *Net) destroyCarrier(ctx context.Context, c journal.Carrier) error {
	defer n.warm.signal()
	if err := n.d.Term.Live(); err != nil {
		return err
	}
	if c.State != journal.CarrierRemoving {
		c.State = journal.CarrierRemoving
		if err := n.d.Run.J.Update(func(tx *journal.Tx) error { return tx.PutCarrier(c) }); err != nil {
			return fmt.Errorf("journal carrier %d removing: %w", c.Slot, err)
		}
	}
	n.d.Run.Crash("carrier:removing")
	if err := n.d.Term.Live(); err != nil {
		return err
	}
	o, err := n.carrierOwner(c.Slot)
	if err != nil {
		return err
	}
	var errs []error
	if err := n.d.Links.Remove(ctx, o.Link()); err != nil {
		errs = append(errs, fmt.Errorf("carrier %d: remove veth: %w", c.Slot, err))
	}
	if err := n.d.Netns.Delete(ctx, c.Netns); err != nil {
		errs = append(errs, fmt.Errorf("carrier %d: delete netns: %w", c.Slot, err))
	}
	n.d.Run.Crash("carrier:removed")
	if ok, d := n.d.Links.CheckGone(ctx, o); !ok {
		errs = append(errs, fmt.Errorf("carrier %d: veth not gone: %s", c.Slot, d))
	}
	id := netpolicy.NSID{Dev: c.NetnsDev, Ino: c.NetnsIno, Cookie: c.NetnsCookie}
	if ok, d := n.d.Netns.CheckGone(ctx, c.Netns, id); !ok {
		errs = append(errs, fmt.Errorf("carrier %d: netns not gone: %s", c.Slot, d))
	}
	if len(errs) > 0 {
		return errors.Join(errs...) // the record keeps the slot out
	}
	if err := n.d.Run.J.Update(func(tx *journal.Tx) error { return tx.DeleteCarrier(c.Slot) }); err != nil {
		return fmt.Errorf("journal carrier %d gone: %w", c.Slot, err)
	}
	return nil
}

// TakeCarrier, inside a claim's admitting transaction, gives rec the
// slot and netns of a ready carrier, if there is one: the carrier record
// goes, and rec's netns and links effect records are journaled done, so
// the generation's teardown removes them. Without a carrier rec gets a
// free slot (none a carrier holds), and the claim makes its network
// inline. Either way the filler is asked to top the pool up. With no free
// slot while a carrier is being made, the error is also ErrCarrierMaking.
func (n *Net) TakeCarrier(tx *journal.Tx, live []journal.Sandbox, rec *journal.Sandbox) error {
	if !n.hasPool() {
		return nil
	}
	cs, err := tx.Carriers()
	if err != nil {
		return err
	}
	if n.carriersOn() {
		defer n.KickCarriers()
		for _, c := range cs {
			if c.State != journal.CarrierReady {
				continue
			}
			if err := tx.DeleteCarrier(c.Slot); err != nil {
				return err
			}
			n.log.Debug("claim takes a warm carrier", "sandbox", rec.ID, "generation", rec.Generation, "slot", c.Slot)
			rec.Slot, rec.Netns = c.Slot, c.Netns
			rec.NetnsDev, rec.NetnsIno, rec.NetnsCookie = c.NetnsDev, c.NetnsIno, c.NetnsCookie
			for _, k := range []journal.Kind{journal.KindNetns, journal.KindLinks} {
				e := journal.Effect{Kind: k, Name: rec.ContainerID, SandboxID: rec.ID, Generation: rec.Generation, State: journal.Done, Epoch: n.d.Run.Epoch, Slot: rec.Slot}
				if err := tx.PutEffect(e); err != nil {
					return err
				}
			}
			return nil
		}
	}
	rec.Slot, err = n.allocSlot(live, carrierSlots(cs)...)
	if err != nil && n.carriersOn() && slices.ContainsFunc(cs, func(c journal.Carrier) bool { return c.State == journal.CarrierMaking }) {
		return errors.Join(ErrCarrierMaking, errdefs.Errorf(errdefs.CodeCapacityExhausted, "%v; a warm carrier is still being made on the last free one", err))
	}
	return err
}

// TookCarrier reports whether rec's generation took a warm carrier: its
// netns (named rec.Netns) and veth were made before its claim.
func TookCarrier(rec journal.Sandbox) bool {
	return rec.Netns != "" && rec.Netns != rec.ContainerID
}

// netnsName is the name of rec's netns: the carrier's if it took one,
// else its container id.
func netnsName(rec journal.Sandbox) string {
	if TookCarrier(rec) {
		return rec.Netns
	}
	return rec.ContainerID
}

// AdoptCarriers, on a takeover, keeps the ready carriers whose netns and
// link exist, up to the pool size, and destroys the others: half made,
// half removed, broken, or more than this primary keeps.
func (n *Net) AdoptCarriers(ctx context.Context) error {
	if !n.hasNet() {
		return nil
	}
	netns, err := n.d.Netns.Mounted(ctx)
	if err != nil {
		return fmt.Errorf("list netns mounts: %w", err)
	}
	links, err := n.d.Links.List(ctx)
	if err != nil {
		return fmt.Errorf("list sandbox links: %w", err)
	}
	haveNetns, haveLink := resource.SetOf(netns), resource.SetOf(links)
	var cs []journal.Carrier
	if err := n.d.Run.J.View(func(tx *journal.Tx) (err error) {
		cs, err = tx.Carriers()
		return err
	}); err != nil {
		return fmt.Errorf("read carriers: %w", err)
	}
	var errs []error
	adopted := 0
	for _, c := range cs {
		link := netpolicy.LinkName(netpolicy.Slot(c.Slot))
		whole := c.State == journal.CarrierReady && haveNetns[c.Netns] && haveLink[link]
		if whole && adopted < n.d.Carriers {
			adopted++
			continue
		}
		if whole {
			n.log.Info("destroying a warm carrier beyond the configured pool", "slot", c.Slot, "carriers", n.d.Carriers)
		} else {
			n.log.Warn("destroying a warm carrier that is not whole", "slot", c.Slot, "state", c.State, "netns", haveNetns[c.Netns], "link", haveLink[link])
		}
		errs = append(errs, n.destroyCarrier(ctx, c))
	}
	if len(cs) > 0 {
		n.log.Info("warm carriers adopted", "adopted", adopted, "destroyed", len(cs)-adopted)
	}
	return errors.Join(errs...)
}

// CarriersOwned adds what the carrier records name to the orphan sweep's
// owned names and held slots.
func (n *Net) CarriersOwned(owned map[journal.Kind]map[string]bool, slots map[uint32]bool) error {
	var cs []journal.Carrier
	if err := n.d.Run.J.View(func(tx *journal.Tx) (err error) {
		cs, err = tx.Carriers()
		return err
	}); err != nil {
		return fmt.Errorf("read carriers: %w", err)
	}
	for _, c := range cs {
		owned[journal.KindNetns][c.Netns] = true
		owned[journal.KindLinks][netpolicy.LinkName(netpolicy.Slot(c.Slot))] = true
		slots[c.Slot] = true
	}
	return nil
}
