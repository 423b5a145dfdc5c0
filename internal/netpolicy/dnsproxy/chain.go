package dnsproxy

import (
	"context"
	"fmt"

	"github.com/miekg/dns"
)

// ChainError is an upstream answer whose CNAME chain the proxy does not
// trust: it is answered with SERVFAIL and nothing is allowed.
type ChainError struct {
	Name string // the queried name
	Why  string
}

func (e *ChainError) Error() string {
	return fmt.Sprintf("CNAME chain of %s: %s", e.Name, e.Why)
}

// chain is a checked answer: the CNAME links from the queried name, in
// order, and the address records at the chain's end.
type chain struct {
	rcode  int
	cnames []*dns.CNAME
	addrs  []dns.RR // *dns.A or *dns.AAAA, the queried type only
	ttl    uint32   // the least TTL of the records above
}

// resolve asks the upstreams for qname and walks the answer's CNAME
// chain: each link's owner is the previous link's target, at most
// MaxChain links, no name twice. Records off the chain are ignored
// (never answered, never allowed). If the chain ends in a target the
// answer holds no records for, the proxy asks for that target itself.
func (p *Proxy) resolve(ctx context.Context, qname string, qtype uint16) (chain, error) {
	var c chain
	cur := dns.CanonicalName(qname)
	seen := map[string]bool{cur: true}
	for {
		r, err := p.exchange(ctx, cur, qtype)
		if err != nil {
			return chain{}, err
		}
		c.rcode = r.Rcode
		cnames := map[string][]*dns.CNAME{}
		addrs := map[string][]dns.RR{}
		for _, rr := range r.Answer {
			h := rr.Header()
			if h.Class != dns.ClassINET {
				continue
			}
			owner := dns.CanonicalName(h.Name)
			switch rr := rr.(type) {
			case *dns.CNAME:
				cnames[owner] = append(cnames[owner], rr)
			case *dns.A, *dns.AAAA:
				if h.Rrtype == qtype {
					addrs[owner] = append(addrs[owner], rr)
				}
			}
		}
		links := len(c.cnames)
		for {
			cs := cnames[cur]
			if len(cs) == 0 {
				break
			}
			if len(cs) > 1 {
				return chain{}, &ChainError{qname, fmt.Sprintf("%d CNAMEs for %s", len(cs), cur)}
			}
			if len(addrs[cur]) > 0 {
				return chain{}, &ChainError{qname, fmt.Sprintf("%s has a CNAME and addresses", cur)}
			}
			if len(c.cnames) == MaxChain {
				return chain{}, &ChainError{qname, fmt.Sprintf("more than %d links", MaxChain)}
			}
			target := dns.CanonicalName(cs[0].Target)
			if seen[target] {
				return chain{}, &ChainError{qname, fmt.Sprintf("loop at %s", target)}
			}
			seen[target] = true
			c.cnames = append(c.cnames, cs[0])
			cur = target
		}
		c.addrs = addrs[cur]
		// The chain ends at cur. Done if it has addresses, is the queried
		// name itself (NODATA), or is known not to exist; otherwise the
		// upstream may have stopped at a target outside its data: ask for
		// the target. Each round adds a link, so MaxChain bounds them.
		if len(c.addrs) > 0 || r.Rcode == dns.RcodeNameError || len(c.cnames) == links {
			break
		}
	}
	first := true
	for _, rr := range c.cnames {
		c.ttl, first = minTTL(c.ttl, rr.Hdr.Ttl, first), false
	}
	for _, rr := range c.addrs {
		c.ttl, first = minTTL(c.ttl, rr.Header().Ttl, first), false
	}
	return c, nil
}

func minTTL(cur, ttl uint32, first bool) uint32 {
	if first {
		return ttl
	}
	return min(cur, ttl)
}
