package warm

import (
	"slices"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/journal"
)

var t0 = time.Date(2026, 12, 7, 11, 0, 0, 0, time.UTC)

func key(tpl string) Key { return Key{Template: tpl, Mode: journal.RootFSOverlay, Runsc: "r1"} }

func idle(id, tpl string, age time.Duration) Member {
	return Member{ID: id, Key: key(tpl), State: Idle, Since: t0.Add(-age)}
}

func TestKeyFor(t *testing.T) {
	ok := Claim{Template: "base", Mode: journal.RootFSOverlay, MemoryBytes: 256 << 20, MemberMemory: 64 << 20}
	if k, why := KeyFor(ok, "r1"); why != "" || k != key("base") {
		t.Fatalf("KeyFor(overlay) = %v, %q", k, why)
	}
	for name, c := range map[string]Claim{
		"block":        {Template: "base", Mode: journal.RootFSBlock, MemoryBytes: 256 << 20},
		"no template":  {Mode: journal.RootFSOverlay, MemoryBytes: 256 << 20},
		"volumes":      {Template: "base", Mode: journal.RootFSOverlay, Volumes: true, MemoryBytes: 256 << 20},
		"small memory": {Template: "base", Mode: journal.RootFSOverlay, MemoryBytes: 32 << 20, MemberMemory: 64 << 20},
	} {
		if _, why := KeyFor(c, "r1"); why == "" {
			t.Errorf("%s: a member may serve it", name)
		}
	}
}

// TestTakeOldestIdleOfItsPool: a claim takes the oldest idle member of
// its own pool, never a booting one or another pool's; none: cold.
func TestTakeOldestIdleOfItsPool(t *testing.T) {
	ms := []Member{
		idle("a-young", "a", time.Minute),
		idle("a-old", "a", time.Hour),
		{ID: "a-boot", Key: key("a"), State: Booting, Since: t0.Add(-2 * time.Hour)},
		idle("b-old", "b", 3*time.Hour),
		{ID: "a-other-runsc", Key: Key{Template: "a", Mode: journal.RootFSOverlay, Runsc: "r0"}, State: Idle, Since: t0.Add(-4 * time.Hour)},
	}
	if m, ok := Take(ms, key("a")); !ok || m.ID != "a-old" {
		t.Fatalf("Take(a) = %v, %v; want a-old", m.ID, ok)
	}
	if _, ok := Take(ms, key("c")); ok {
		t.Fatal("Take of a pool without members found one")
	}
	if _, ok := Take(ms[2:3], key("a")); ok {
		t.Fatal("Take took a booting member")
	}
}

// TestDecide walks the pool's decisions as a table of states.
func TestDecide(t *testing.T) {
	s := Settings{Sizes: map[string]int{"a": 2, "b": 1}, RefillEvery: 10 * time.Second, MaxAge: time.Hour}
	for _, tc := range []struct {
		name     string
		s        Settings
		members  []Member
		lastBoot time.Time
		runsc    string
		boot     string // template of the member to boot ("": none)
		expire   []string
	}{
		{name: "empty pools boot the largest deficit first", s: s, boot: "a"},
		{name: "then the other", s: s, members: []Member{idle("a1", "a", 0), idle("a2", "a", 0)}, boot: "b"},
		{name: "full", s: s, members: []Member{idle("a1", "a", 0), idle("a2", "a", 0), idle("b1", "b", 0)}},
		{name: "one boot at a time", s: s, members: []Member{{ID: "a1", Key: key("a"), State: Booting, Since: t0}}},
		{name: "rate limited", s: s, lastBoot: t0.Add(-5 * time.Second)},
		{name: "after the refill interval", s: s, lastBoot: t0.Add(-10 * time.Second), boot: "a"},
		{name: "budget caps all pools", s: Settings{Sizes: s.Sizes, Budget: 2}, members: []Member{idle("a1", "a", 0), idle("a2", "a", 0)}},
		{name: "expiring members hold the budget", s: Settings{Sizes: s.Sizes, Budget: 2}, members: []Member{idle("a1", "a", 0), {ID: "x", Key: key("a"), State: Expiring, Since: t0}}},
		{name: "an expired member's replacement waits for its destroy under a full budget", s: Settings{Sizes: map[string]int{"a": 1}, MaxAge: time.Hour}, members: []Member{idle("a1", "a", time.Hour)}, expire: []string{"a1"}},
		{name: "too old expires", s: s, members: []Member{idle("a1", "a", time.Hour), idle("a2", "a", time.Minute), idle("b1", "b", 0)}, expire: []string{"a1"}},
		{name: "another runsc build expires", s: s, runsc: "r2", members: []Member{idle("a1", "a", 0)}, expire: []string{"a1"}, boot: "a"},
		{name: "a pool no longer wanted expires", s: Settings{Sizes: map[string]int{"a": 1}}, members: []Member{idle("a1", "a", 0), idle("c1", "c", 0)}, expire: []string{"c1"}},
		{name: "a lowered size expires the oldest", s: Settings{Sizes: map[string]int{"a": 1}}, members: []Member{idle("a1", "a", time.Minute), idle("a2", "a", 2*time.Minute)}, expire: []string{"a2"}},
		{name: "no settings: no pool", s: Settings{}, members: []Member{idle("a1", "a", 0)}, expire: []string{"a1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runsc := tc.runsc
			if runsc == "" {
				runsc = "r1"
			}
			p := Decide(tc.s, tc.members, tc.lastBoot, t0, runsc)
			var boot string
			if p.Boot != nil {
				boot = p.Boot.Template
				if p.Boot.Runsc != runsc || p.Boot.Mode != journal.RootFSOverlay {
					t.Errorf("boot key %v: not this node's runsc or overlay", *p.Boot)
				}
			}
			if boot != tc.boot {
				t.Errorf("boot = %q, want %q", boot, tc.boot)
			}
			if !slices.Equal(p.Expire, tc.expire) {
				t.Errorf("expire = %v, want %v", p.Expire, tc.expire)
			}
			if again := Decide(tc.s, tc.members, tc.lastBoot, t0, runsc); !slices.Equal(again.Expire, p.Expire) || (again.Boot == nil) != (p.Boot == nil) {
				t.Errorf("Decide is not pure: %+v then %+v", p, again)
			}
		})
	}
}

// TestDecideNextAt: a rate-limited pool says when to look again; a
// full one when its oldest member expires.
func TestDecideNextAt(t *testing.T) {
	s := Settings{Sizes: map[string]int{"a": 1}, RefillEvery: 10 * time.Second, MaxAge: time.Hour}
	if p := Decide(s, nil, t0.Add(-4*time.Second), t0, "r1"); !p.NextAt.Equal(t0.Add(6 * time.Second)) {
		t.Errorf("rate limited: NextAt = %v, want in 6 s", p.NextAt)
	}
	if p := Decide(s, []Member{idle("a1", "a", 20*time.Minute)}, time.Time{}, t0, "r1"); !p.NextAt.Equal(t0.Add(40 * time.Minute)) {
		t.Errorf("full: NextAt = %v, want at the member's expiry", p.NextAt)
	}
}

func TestHitRate(t *testing.T) {
	if r := (Stats{}).HitRate(); r != 0 {
		t.Errorf("no claims: %v", r)
	}
	if r := (Stats{Hits: 3, Misses: 1}).HitRate(); r != 0.75 {
		t.Errorf("3 of 4: %v", r)
	}
}
