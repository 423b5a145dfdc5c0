package node

import (
	"context"
	"fmt"

	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/guest"
	"github.com/ctld/ctld/internal/node/overlay"
	"github.com/ctld/ctld/internal/node/resource"
	"github.com/ctld/ctld/internal/proof"
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
	add(guest.Entries(n.guest)...)                                                                      // guest
	add(overlay.Entries(n.overlay)...)                                                                  // overlay
	add(writerResource{n}, blockMountResource{n})                                                       // blockroot
	add(volumesResource{n})                                                                             // pvolume
	add(netnsResource{n}, linksResource{n}, conntrackResource{n: n}, nftResource{n}, dnsResource{n: n}) // network
}

// CrashPoints lists every crash point of a generation's life, in the order
// a claim and then its teardown and a takeover's orphan handling reach
// them (see Deps.Crash): derived from the table's declared specs.
func CrashPoints() []string { return newTable(&Node{}).CrashPoints(updateCrashPoints) }

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
