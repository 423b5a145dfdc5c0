// Package warm is the warm pool's plain data (issue 27): which claims a
// pool member may serve, which members the pool should boot or expire
// now, and which idle member a claim takes. It decides; it makes nothing.
// The node journals and makes what Plan returns (docs/architecture.md
// "Warm pool").
//
// A member is a whole guest booted ahead: a lease with the pool's small
// neutral limits, a fresh overlay upper on the template, a warm carrier
// (deny_all), and runsc with ctl-agent --warm as its init and no
// workload. A claim that takes one resizes its lease live, applies its
// network policy, and starts its workload through the agent's one claim
// call, whose answer (the claim's nonce) is the readiness proof.
package warm

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/ctld/ctld/internal/journal"
)

// Key names a pool: its members are interchangeable.
type Key struct {
	Template string
	Mode     journal.RootFSMode
	// Runsc is the runsc build the members run (its version): a new
	// build on the node makes the old members expire.
	Runsc string
}

func (k Key) String() string { return fmt.Sprintf("%s/%s/%s", k.Template, k.Mode, k.Runsc) }

// Settings are the pools' sizes and bounds (ctld --warm-pool, ctld.toml
// [warm]).
type Settings struct {
	// Sizes is the idle members wanted per template (overlay mode, this
	// node's runsc build). Empty: no pool, every claim is cold.
	Sizes map[string]int
	// Budget caps the members of all pools together, booting and
	// idle (0: the sum of Sizes).
	Budget int
	// RefillEvery is the least time between two member boots, and at
	// most one member boots at a time: a drained pool never competes
	// with the claims that drained it for more than one boot's CPU.
	RefillEvery time.Duration
	// MaxAge expires an idle member that long after it became idle, so a
	// new template generation reaches the pool (0: DefaultMaxAge).
	MaxAge time.Duration
}

// DefaultMaxAge is Settings.MaxAge's default.
const DefaultMaxAge = 30 * time.Minute

// State is a member's place in its life.
type State string

// Member states. A member is journaled from Booting on; Taken members
// belong to their claim's generation from the admitting transaction.
const (
	Booting State = "booting"
	Idle    State = "idle"
	// Expiring members are being destroyed (cleanup proof), their
	// capacity still held.
	Expiring State = "expiring"
)

// Member is one pool member as the journal has it.
type Member struct {
	ID    string
	Key   Key
	State State
	// Since is when the member entered its state.
	Since time.Time
}

// Claim is what of a claim decides whether a member may serve it.
type Claim struct {
	Template string
	Mode     journal.RootFSMode
	// Volumes: persistent volumes are bound into the OCI spec at create,
	// which a member was made without.
	Volumes bool
	// MemoryBytes is the claim's memory.max: never below what the idle
	// member already uses (MemberMemory), or its live resize would OOM-kill
	// the guest it is given.
	MemoryBytes, MemberMemory int64
}

// KeyFor is the pool whose members may serve c on a node running runsc
// build, or why none may ("" when one may).
func KeyFor(c Claim, runsc string) (Key, string) {
	k := Key{Template: c.Template, Mode: c.Mode, Runsc: runsc}
	switch {
	case c.Mode != journal.RootFSOverlay:
		return k, "only overlay claims have warm pools"
	case c.Template == "":
		return k, "no template"
	case c.Volumes:
		return k, "persistent volumes are bound at create"
	case c.MemoryBytes < c.MemberMemory:
		return k, "the claim's memory is below an idle member's"
	}
	return k, ""
}

// Take is the idle member of k a claim takes: the oldest (the nearest to
// expiry), or false when the pool has none (the claim goes cold).
func Take(members []Member, k Key) (Member, bool) {
	var best Member
	found := false
	for _, m := range members {
		if m.Key == k && m.State == Idle && (!found || m.Since.Before(best.Since)) {
			best, found = m, true
		}
	}
	return best, found
}

// Plan is what the pool should do now.
type Plan struct {
	// Boot is the pool to boot one member of (nil: none now).
	Boot *Key
	// Expire are the idle members to destroy: too old, or of a pool the
	// settings no longer want (size 0, another runsc build).
	Expire []string
	// NextAt is when Plan may say more without a member changing state
	// (zero: nothing is pending on time).
	NextAt time.Time
}

// Decide plans the pools' next step at now, given the members the journal
// has, when the last member boot started, and this node's runsc build. It
// is pure: the same inputs give the same plan.
func Decide(s Settings, members []Member, lastBoot, now time.Time, runsc string) Plan {
	maxAge := cmp.Or(s.MaxAge, DefaultMaxAge)
	var p Plan
	keep := map[Key]int{} // idle or booting members that stay, per pool
	booting, held := 0, 0 // members holding capacity
	for _, m := range members {
		held++
		switch m.State {
		case Booting:
			booting++
			keep[m.Key]++
		case Idle:
			want := s.Sizes[m.Key.Template]
			if m.Key.Runsc != runsc || m.Key.Mode != journal.RootFSOverlay || want == 0 || !now.Before(m.Since.Add(maxAge)) {
				p.Expire = append(p.Expire, m.ID)
				continue
			}
			keep[m.Key]++
			p.NextAt = earliest(p.NextAt, m.Since.Add(maxAge))
		}
	}
	slices.Sort(p.Expire)
	// Members over a pool's size (a size lowered) expire, oldest first.
	for _, tpl := range sortedKeys(s.Sizes) {
		k := Key{Template: tpl, Mode: journal.RootFSOverlay, Runsc: runsc}
		if over := keep[k] - s.Sizes[tpl]; over > 0 {
			idle := idleOf(members, k, p.Expire)
			for _, m := range idle[:min(over, len(idle))] {
				p.Expire = append(p.Expire, m.ID)
				keep[k]--
			}
		}
	}
	budget := s.Budget
	if budget <= 0 {
		for _, n := range s.Sizes {
			budget += n
		}
	}
	if booting > 0 || held >= budget {
		return p
	}
	k := deficit(s, keep, runsc)
	if k == nil {
		return p
	}
	if next := lastBoot.Add(s.RefillEvery); !lastBoot.IsZero() && now.Before(next) {
		p.NextAt = earliest(p.NextAt, next)
		return p
	}
	p.Boot = k
	return p
}

// deficit is the pool furthest below its size (ties: by template name),
// or nil when every pool is full.
func deficit(s Settings, keep map[Key]int, runsc string) *Key {
	var best *Key
	bestGap := 0
	for _, tpl := range sortedKeys(s.Sizes) {
		k := Key{Template: tpl, Mode: journal.RootFSOverlay, Runsc: runsc}
		if gap := s.Sizes[tpl] - keep[k]; gap > bestGap {
			kk := k
			best, bestGap = &kk, gap
		}
	}
	return best
}

// idleOf is k's idle members not already expiring, oldest first.
func idleOf(members []Member, k Key, expiring []string) []Member {
	var out []Member
	for _, m := range members {
		if m.Key == k && m.State == Idle && !slices.Contains(expiring, m.ID) {
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b Member) int { return a.Since.Compare(b.Since) })
	return out
}

func sortedKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// Stats are a pool's counters since the primary's term began.
type Stats struct {
	Idle, Booting int
	// Hits are claims that took a member, Misses claims of the pool that
	// found none and went cold.
	Hits, Misses uint64
}

// HitRate is Hits/(Hits+Misses), 0 before any claim.
func (s Stats) HitRate() float64 {
	if s.Hits+s.Misses == 0 {
		return 0
	}
	return float64(s.Hits) / float64(s.Hits+s.Misses)
}
