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
	// rateLog and capLog are when a refusal was last logged, rateN and
	// capN the refusals since: a flood logs once a minute, not once a
	// query (or once a token).
	rateLog, capLog time.Time
	rateN, capN     int
}

// logEvery is how often a sandbox's refusals of one kind are logged.
const logEvery = time.Minute

// logDue counts a refusal and reports whether to log now, with the
// refusals since the last log (this one included).
func logDue(last *time.Time, n *int, now time.Time) (bool, int) {
	*n++
	if !last.IsZero() && now.Sub(*last) < logEvery {
		return false, *n
	}
	k := *n
	*last, *n = now, 0
	return true, k
}

func newUsage(burst int, now time.Time) *usage {
	return &usage{tokens: float64(burst), last: now, addrs: map[netip.Addr]time.Time{}}
}

// take spends a token of a bucket of rate tokens a second holding at most
// burst; false: none left, and then log says to log the refusal (refused:
// how many since the last log).
func (u *usage) take(now time.Time, rate float64, burst int) (ok, log bool, refused int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if d := now.Sub(u.last); d > 0 {
		u.tokens = min(float64(burst), u.tokens+d.Seconds()*rate)
		u.last = now
	}
	if u.tokens >= 1 {
		u.tokens--
		return true, false, 0
	}
	log, refused = logDue(&u.rateLog, &u.rateN, now)
	return false, log, refused
}

// reserve accounts addrs as kept until until, if the distinct addresses
// not yet expired stay within limit; otherwise it changes nothing and
// says how many are kept (log, refused: as take's). An address already
// kept only has its expiry moved later.
func (u *usage) reserve(addrs []netip.Addr, until, now time.Time, limit int) (ok bool, kept int, log bool, refused int) {
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
			log, refused = logDue(&u.capLog, &u.capN, now)
			return false, len(u.addrs), log, refused
		}
	}
	for _, a := range addrs {
		if until.After(u.addrs[a]) {
			u.addrs[a] = until
		}
	}
	return true, len(u.addrs), false, 0
}
