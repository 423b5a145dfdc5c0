// Package resource is the resource table of a generation: the entry
// interface every kind of kernel object a generation owns implements, with
// its declared Spec, small optional interfaces, and the Table built from
// the configured subsystems, from which the claim order, the crash points
// and the timing phases are derived. A kind is one type implementing
// Entry plus one Builder.Add line. It knows journal records, not the node:
// the claim's shared state is the type parameter C.
package resource

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/proof"
)

// Phase is where in a claim an entry is made: the claim order (a stable
// sort by Phase, then registration) and the claim timing it counts in.
type Phase int

// Phases, in claim order.
const (
	PhaseLease   Phase = iota // the log dir and the lease cgroup: Timings.LeaseMS
	PhaseRootFS               // disk, mounts, writers, volumes: Timings.RootFSMS
	PhaseNetwork              // netns, links, conntrack, nft, dns: Timings.NetworkMS
	PhaseGuest                // agent dir, bundle, runsc: Timings.RunscMS
)

// Spec is what an entry declares about itself; it is all an absent entry
// (a subsystem that is not configured) has.
type Spec struct {
	// Kind is the journal effect kind, the prefix of the crash points and
	// the name of the timing step.
	Kind  journal.Kind
	Phase Phase
	// Mode is the RootFS mode whose generations have the entry ("": all).
	Mode journal.RootFSMode
	// Check is the name of the cleanup proof's check of the entry.
	Check string
	// Sweeps says whether the orphan sweep lists the entry's objects.
	Sweeps bool
	// RemovePoints are the crash points inside Remove, between its
	// removing and removed points.
	RemovePoints []string
	// Absent is the proof check's detail when the subsystem is not
	// configured ("" : "<kind> not configured on this node").
	Absent string
	// Optional says a generation goes without the entry on a node
	// without its subsystem (a deny_all sandbox without a veth): its
	// claim skips the absent entry. An absent entry that is not optional
	// refuses the claims that need it (unavailable).
	Optional bool
}

// Entry is one kind of kernel object of a generation. C is the claim's
// shared state (the generation's record and what earlier entries made).
type Entry[C any] interface {
	Spec() Spec
	// Make creates the generation's object: a claim step.
	Make(ctx context.Context, c C) error
	// Remove removes the generation's object; absent is success.
	Remove(ctx context.Context, rec journal.Sandbox) error
	// Gone is the cleanup proof's check that the object is physically gone.
	Gone(ctx context.Context, rec journal.Sandbox) proof.Check
}

// Lister is an entry whose objects the orphan sweep lists.
type Lister interface {
	// List names the objects of this kind that exist now, as Name names
	// them (read fresh).
	List(ctx context.Context) ([]string, error)
	// Name is the name List gives rec's object ("" if rec has none).
	Name(rec journal.Sandbox) string
	// RemoveOrphan removes an object List found that no generation owns.
	RemoveOrphan(ctx context.Context, name string) error
}

// Needer is an entry a generation may not need (persistent volumes, when
// its claim names none): its claim neither journals nor makes it; its
// teardown still runs its check.
type Needer interface {
	Needed(rec journal.Sandbox) bool
}

// Builder collects the entries of a table.
type Builder[C any] struct {
	entries []Entry[C]
}

// Add registers e; present says whether its subsystem is configured
// (decided once, by the concern that registers it: the entries of a
// present subsystem never check for it again). An absent entry keeps
// only its Spec (and whether a generation needs it): a claim skips it if
// it is optional and refuses otherwise, its removal refuses, the sweep
// passes it over, and its proof check holds while the journal has no
// effect of its kind for the generation (AbsentCheck).
func (b *Builder[C]) Add(e Entry[C], present bool) {
	if !present {
		a := absent[C]{spec: e.Spec()}
		if n, ok := e.(Needer); ok {
			a.need = n.Needed
		}
		e = a
	}
	b.entries = append(b.entries, e)
}

// Table orders the entries: by Phase, then registration.
func (b *Builder[C]) Table() *Table[C] {
	es := slices.Clone(b.entries)
	slices.SortStableFunc(es, func(x, y Entry[C]) int { return cmp.Compare(x.Spec().Phase, y.Spec().Phase) })
	return &Table[C]{entries: es}
}

// Table is a generation's entries in claim order.
type Table[C any] struct {
	entries []Entry[C]
}

// All is every entry, in claim order.
func (t *Table[C]) All() []Entry[C] { return t.entries }

// Kind returns the entry of kind, or nil.
func (t *Table[C]) Kind(kind journal.Kind) Entry[C] {
	for _, e := range t.entries {
		if e.Spec().Kind == kind {
			return e
		}
	}
	return nil
}

// For is the entries of rec's generation: all but those of the other
// RootFS mode.
func (t *Table[C]) For(rec journal.Sandbox) []Entry[C] {
	mode := rec.RootFS.Mode
	if mode == "" {
		mode = journal.RootFSOverlay // records from before modes
	}
	var out []Entry[C]
	for _, e := range t.entries {
		if m := e.Spec().Mode; m == "" || m == mode {
			out = append(out, e)
		}
	}
	return out
}

// Claim is the entries rec's claim makes: For(rec) but those it does not
// need.
func (t *Table[C]) Claim(rec journal.Sandbox) []Entry[C] {
	return slices.DeleteFunc(t.For(rec), func(e Entry[C]) bool {
		n, ok := e.(Needer)
		return ok && !n.Needed(rec)
	})
}

// Present says whether e's subsystem is configured.
func Present[C any](e Entry[C]) bool {
	_, ok := e.(absent[C])
	return !ok
}

// CrashPoints lists every crash point of a generation's life, in the order
// a claim, then extra (points between the claim and the teardown, a live
// network update's), the teardown and a takeover's orphan handling reach
// them.
func (t *Table[C]) CrashPoints(extra []string) []string {
	var out []string
	for _, e := range t.entries {
		for _, s := range []string{"intended", "made", "done"} {
			out = append(out, string(e.Spec().Kind)+":"+s)
		}
	}
	out = append(out, extra...)
	for _, e := range slices.Backward(t.entries) {
		sp := e.Spec()
		out = append(out, string(sp.Kind)+":removing")
		out = append(out, sp.RemovePoints...)
		out = append(out, string(sp.Kind)+":removed")
	}
	out = append(out, "proof:signed")
	for _, e := range slices.Backward(t.entries) {
		out = append(out, "orphan:"+string(e.Spec().Kind))
	}
	return out
}

// Timings are the claim timings the phases count in.
func Timings(t *journal.Timings) map[Phase]*float64 {
	return map[Phase]*float64{PhaseLease: &t.LeaseMS, PhaseRootFS: &t.RootFSMS, PhaseNetwork: &t.NetworkMS, PhaseGuest: &t.RunscMS}
}

// Phases maps each kind to the claim timing it counts in.
func (t *Table[C]) Phases(tm *journal.Timings) map[journal.Kind]*float64 {
	ph := Timings(tm)
	out := map[journal.Kind]*float64{}
	for _, e := range t.entries {
		out[e.Spec().Kind] = ph[e.Spec().Phase]
	}
	return out
}

// AbsentCheck is the proof check of an entry whose subsystem is not
// configured: it holds while the journal has no effect of its kind for the
// generation (recorded), since nothing could have made one.
func AbsentCheck(sp Spec, recorded bool) proof.Check {
	detail := sp.Absent
	if detail == "" {
		detail = string(sp.Kind) + " not configured on this node"
	}
	if recorded {
		return proof.Check{Name: sp.Check, OK: false, Detail: detail + ", yet the journal has an effect of this kind"}
	}
	return proof.Check{Name: sp.Check, OK: true, Detail: detail}
}

// absent stands for an entry whose subsystem is not configured.
type absent[C any] struct {
	spec Spec
	need func(journal.Sandbox) bool // the entry's Needed (nil: every generation)
}

// Needed: a claim skips an optional absent entry, and one its generation
// does not need; the others refuse in Make.
func (a absent[C]) Needed(rec journal.Sandbox) bool {
	return !a.spec.Optional && (a.need == nil || a.need(rec))
}

func (a absent[C]) Spec() Spec { s := a.spec; s.Sweeps = false; return s }
func (a absent[C]) Make(context.Context, C) error {
	return errdefs.Errorf(errdefs.CodeUnavailable, "%s: not configured on this node", a.spec.Kind)
}
func (a absent[C]) Remove(context.Context, journal.Sandbox) error {
	return fmt.Errorf("%s: not configured on this node, cannot remove", a.spec.Kind)
}
func (a absent[C]) Gone(context.Context, journal.Sandbox) proof.Check {
	return AbsentCheck(a.spec, false)
}

// Survey: a ready generation that needs the entry (made by an earlier
// term, on a node that had the subsystem) has lost it here; one that
// goes without it (optional) has lost nothing.
func (a absent[C]) Survey(context.Context) (Missing, error) {
	return func(_ context.Context, rec journal.Sandbox) string {
		if a.Needed(rec) {
			return string(a.spec.Kind) + " (not configured on this node)"
		}
		return ""
	}, nil
}
