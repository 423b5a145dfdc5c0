package dnsproxy

import (
	"net/netip"
	"sync"
	"time"
)

// What one sandbox may make the proxy do: a query rate (a token bucket)
// and a cap on the distinct addresses the proxy keeps in its domain sets.
// Names under an allowed wildcard are the guest's to invent, so without
// them a guest could make the node resolve without end and grow its sets
// (kernel memory, one netlink transaction an answer).
//
// At the cap the proxy refuses, it does not evict: the query that would
// go past it gets SERVFAIL (with an Extended DNS Error saying why) and
// adds nothing, until elements expire. Evicting the oldest would let a
// flood of invented names silently close addresses the guest still has
// cached from names it really uses; refusing keeps what was answered
// working, costs the flooding sandbox only its own new names, and needs
// no read of the kernel's sets. The kernel's set size (nft `size`,
// netpolicy.DomainSetSize) is the hard bound behind this count: after a
// failover the new proxy starts counting from zero while the sets keep
// their elements, and then the kernel's refusal (ENFILE) fails the answer
// closed the same way.

// usage is one generation's account. It outlives a Register of the same
// generation (a live update), not the generation.
type usage struct {
	mu     sync.Mutex
	tokens float64
	last   time.Time
	addrs  map[netip.Addr]time.Time // in the sets until (the latest expiry)
	// full and limited remember that a refusal was logged, so a flood
	// logs once per episode, not once a query.
	full, limited bool
}

func newUsage(burst int, now time.Time) *usage {
	return &usage{tokens: float64(burst), last: now, addrs: map[netip.Addr]time.Time{}}
}

// take spends a token of a bucket of rate tokens a second holding at most
// burst; false: none left. first is true when this refusal starts an
// episode (log it).
func (u *usage) take(now time.Time, rate float64, burst int) (ok, first bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if d := now.Sub(u.last); d > 0 {
		u.tokens = min(float64(burst), u.tokens+d.Seconds()*rate)
		u.last = now
	}
	if u.tokens >= 1 {
		u.tokens--
		u.limited = false
		return true, false
	}
	first, u.limited = !u.limited, true
	return false, first
}

// reserve accounts addrs as kept until until, if the distinct addresses
// not yet expired stay within limit; otherwise it changes nothing and
// says how many are kept (first: this refusal starts an episode). An
// address already kept only has its expiry moved later.
func (u *usage) reserve(addrs []netip.Addr, until, now time.Time, limit int) (ok bool, kept int, first bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	grow := 0
	for _, a := range addrs {
		if _, ok := u.addrs[a]; !ok {
			grow++
		}
	}
	if len(u.addrs)+grow > limit {
		for a, exp := range u.addrs {
			if !exp.After(now) {
				delete(u.addrs, a)
			}
		}
		grow = 0
		for _, a := range addrs {
			if _, ok := u.addrs[a]; !ok {
				grow++
			}
		}
		if len(u.addrs)+grow > limit {
			first, u.full = !u.full, true
			return false, len(u.addrs), first
		}
	}
	u.full = false
	for _, a := range addrs {
		if until.After(u.addrs[a]) {
			u.addrs[a] = until
		}
	}
	return true, len(u.addrs), false
}
