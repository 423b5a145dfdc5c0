package dnsproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/miekg/dns"

	"github.com/ctld/ctld/internal/netpolicy"
)

// serveDNS is the listeners' handler: it bounds the work in flight, finds
// the sandbox, answers, and fits the answer to the transport.
func (p *Proxy) serveDNS(ctx context.Context, w dns.ResponseWriter, req *dns.Msg) {
	src := addrOf(w.RemoteAddr())
	// The bounds count queries worked on: each is left once the answer is
	// made, before it is written, so a guest that asks again as soon as it
	// reads an answer is not over its bound.
	var leave []func()
	defer func() {
		for _, f := range leave {
			f()
		}
	}()
	select {
	case p.slots <- struct{}{}:
		leave = append(leave, func() { <-p.slots })
	default:
		p.drop(w, "proxy", src)
		return
	}
	e := p.lookup(src)
	if e != nil {
		if ok, log, refused := e.use.take(p.cfg.Now(), p.cfg.QueryRate, p.cfg.QueryBurst); !ok {
			if log {
				p.log.Warn("dns proxy: sandbox over its query rate, refusing until it slows down", "sandbox", e.owner.ID,
					"generation", e.owner.Generation, "rate", p.cfg.QueryRate, "burst", p.cfg.QueryBurst, "refused", refused)
			}
			resp := reply(req, dns.RcodeRefused)
			addEDE(req, resp, dns.ExtendedErrorCodeOther, BlockedText+": "+RateLimitedText)
			p.write(w, req, resp, src)
			return
		}
		slot := e.owner.Block.Slot
		if !p.enter(slot) {
			p.drop(w, e.owner.Alias(), src)
			return
		}
		leave = append(leave, func() { p.leave(slot) })
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.QueryTimeout)
	resp := p.answer(ctx, e, req)
	cancel()
	for _, f := range leave {
		f()
	}
	leave = nil
	p.write(w, req, resp, src)
}

// write fits resp to the transport and sends it.
func (p *Proxy) write(w dns.ResponseWriter, req, resp *dns.Msg, src netip.Addr) {
	size := dns.MaxMsgSize
	if _, udp := w.RemoteAddr().(*net.UDPAddr); udp {
		size = dns.MinMsgSize
		if opt := req.IsEdns0(); opt != nil {
			size = max(size, min(int(opt.UDPSize()), EDNSSize))
		}
	}
	resp.Truncate(size) // sets TC over UDP: the guest asks again over TCP
	if p.cfg.Observe != nil {
		p.cfg.Observe(resp.Rcode, false)
	}
	if err := w.WriteMsg(resp); err != nil {
		p.log.Debug("dns proxy: write answer", "src", src, "err", err)
	}
}

// drop leaves a query unanswered (the guest's resolver retries) when the
// proxy or one sandbox has too many in flight.
func (p *Proxy) drop(w dns.ResponseWriter, who string, src netip.Addr) {
	p.log.Warn("dns proxy: too many queries in flight, dropped one", "limit", who, "src", src)
	if p.cfg.Observe != nil {
		p.cfg.Observe(0, true)
	}
	if _, tcp := w.RemoteAddr().(*net.TCPAddr); tcp {
		w.Close() // a TCP client would otherwise wait for its read timeout
	}
}

func (p *Proxy) enter(slot netpolicy.Slot) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inflight[slot] >= p.cfg.MaxPerSandbox {
		return false
	}
	p.inflight[slot]++
	return true
}

func (p *Proxy) leave(slot netpolicy.Slot) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inflight[slot]--; p.inflight[slot] <= 0 {
		delete(p.inflight, slot)
	}
}

func addrOf(a net.Addr) netip.Addr {
	switch a := a.(type) {
	case *net.UDPAddr:
		return a.AddrPort().Addr().Unmap()
	case *net.TCPAddr:
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

// answer is the whole decision for one query of e's sandbox (nil: an
// unknown source).
func (p *Proxy) answer(ctx context.Context, e *entry, req *dns.Msg) *dns.Msg {
	if len(req.Question) != 1 {
		return reply(req, dns.RcodeFormatError)
	}
	if e == nil {
		return reply(req, dns.RcodeRefused)
	}
	q := req.Question[0]
	log := p.log.With("sandbox", e.owner.ID, "generation", e.owner.Generation, "name", q.Name, "type", dns.TypeToString[q.Qtype])
	if q.Qclass != dns.ClassINET {
		return reply(req, dns.RcodeRefused)
	}
	name, ok := queryName(q.Name)
	var sets []int
	if ok {
		sets, ok = e.allowed(name)
	}
	if !ok {
		log.Debug("dns proxy: name refused by policy")
		return blocked(req, dns.RcodeRefused, "")
	}
	if q.Qtype != dns.TypeA && (q.Qtype != dns.TypeAAAA || !e.eff.Source6.IsValid()) {
		// NODATA: only addresses are the proxy's business, and a sandbox
		// without IPv6 would only wait for its AAAA answers to fail.
		return reply(req, dns.RcodeSuccess)
	}
	c, err := p.resolve(ctx, q.Name, q.Qtype)
	if err != nil {
		log.Warn("dns proxy: resolve", "err", err)
		return reply(req, dns.RcodeServerFailure)
	}
	// The policy may have changed while the upstream answered: decide
	// again by the entry current now, and hold it until the answer is in
	// the sets.
	cur, release := p.hold(e)
	defer release()
	if cur == nil {
		return reply(req, dns.RcodeRefused)
	}
	if cur != e {
		e = cur
		log = log.With("generation", e.owner.Generation)
		if sets, ok = e.allowed(name); !ok {
			log.Debug("dns proxy: name refused by the policy registered while it was resolved")
			return blocked(req, dns.RcodeRefused, "")
		}
		if q.Qtype == dns.TypeAAAA && !e.eff.Source6.IsValid() {
			return reply(req, dns.RcodeSuccess)
		}
	}
	addrs, rrs := e.keep(c.addrs)
	if len(rrs) < len(c.addrs) {
		log.Warn("dns proxy: dropped answers in denied ranges", "answered", len(c.addrs), "kept", len(rrs))
	}
	ttl := p.elementTTL(c.ttl)
	if len(addrs) > 0 && len(sets) > 0 {
		now := p.cfg.Now()
		ok, kept, logNow, refused := e.use.reserve(addrs, now.Add(ttl), now, p.cfg.MaxAddrsPerSandbox)
		if !ok {
			if logNow {
				log.Warn("dns proxy: sandbox at its cap of resolved addresses, refusing new ones until some expire",
					"cap", p.cfg.MaxAddrsPerSandbox, "kept", kept, "refused", refused)
			}
			resp := reply(req, dns.RcodeServerFailure)
			addEDE(req, resp, dns.ExtendedErrorCodeOther, fmt.Sprintf("%s: %s (%d)", BlockedText, AddrCapText, p.cfg.MaxAddrsPerSandbox))
			return resp
		}
		for _, i := range sets {
			if err := p.cfg.Allower.AllowResolved(ctx, e.owner, i, addrs, ttl); err != nil {
				// Fail closed: an answer the firewall does not know of
				// would only send the guest into a drop.
				log.Error("dns proxy: allow resolved addresses", "set", i, "addrs", addrs, "err", err)
				return reply(req, dns.RcodeServerFailure)
			}
		}
	}
	resp := reply(req, c.rcode)
	// Every record gets the chain's clamped TTL: the guest caches neither
	// an address longer than its set element lives, nor a CNAME whose
	// target it cannot ask the proxy for (targets need not be allowed).
	clientTTL := uint32(min(time.Duration(c.ttl)*time.Second, MaxTTL) / time.Second)
	for _, rr := range c.cnames {
		rr.Hdr.Ttl = clientTTL
		resp.Answer = append(resp.Answer, rr)
	}
	for _, rr := range rrs {
		rr.Header().Ttl = clientTTL
		resp.Answer = append(resp.Answer, rr)
	}
	if len(rrs) < len(c.addrs) {
		addEDE(req, resp, dns.ExtendedErrorCodeFiltered, BlockedText+": answers in denied ranges dropped")
	}
	return resp
}

// allowed reports whether the policy lets name be resolved, and the
// indexes of the domain sets it matches.
func (e *entry) allowed(name string) ([]int, bool) {
	var sets []int
	for i, m := range e.sets {
		if m.match(name) {
			sets = append(sets, i)
		}
	}
	switch e.eff.Mode {
	case netpolicy.ModeOpen:
		return sets, true
	case netpolicy.ModeRestricted:
		return sets, len(sets) > 0
	}
	return nil, false // deny_all, and anything unknown
}

// keep drops the answers in the policy's denied ranges (DNS rebinding to
// metadata, the node, other sandboxes, private ranges not listed), IPv4
// mapped into IPv6, and those past MaxAddrs.
func (e *entry) keep(rrs []dns.RR) ([]netip.Addr, []dns.RR) {
	var addrs []netip.Addr
	var kept []dns.RR
	for _, rr := range rrs {
		var a netip.Addr
		var ok bool
		switch rr := rr.(type) {
		case *dns.A:
			a, ok = netip.AddrFromSlice(rr.A.To4())
		case *dns.AAAA:
			a, ok = netip.AddrFromSlice(rr.AAAA.To16())
			ok = ok && a.Is6() && !a.Is4In6()
		}
		if !ok || e.denied(a) || len(kept) == MaxAddrs {
			continue
		}
		addrs = append(addrs, a)
		kept = append(kept, rr)
	}
	return addrs, kept
}

func (e *entry) denied(a netip.Addr) bool {
	deny := e.eff.Deny4
	if a.Is6() {
		deny = e.eff.Deny6
		if !e.eff.Source6.IsValid() {
			return true // no IPv6 for this sandbox at all
		}
	}
	for _, r := range deny {
		if r.Contains(a) {
			return true
		}
	}
	return false
}

// ElementTimeout is the set element timeout the proxy gives the
// addresses of an answer of ttl seconds.
func (p *Proxy) ElementTimeout(ttl uint32) time.Duration { return p.elementTTL(ttl) }

// elementTTL is a set element's timeout for an answer of ttl seconds.
func (p *Proxy) elementTTL(ttl uint32) time.Duration {
	return min(max(time.Duration(ttl)*time.Second, p.cfg.ElementMinTTL), MaxTTL) + p.cfg.ElementGrace
}

func reply(req *dns.Msg, rcode int) *dns.Msg {
	m := new(dns.Msg)
	m.SetRcode(req, rcode)
	m.RecursionAvailable = true
	m.CheckingDisabled = false
	if req.IsEdns0() != nil {
		m.SetEdns0(EDNSSize, false)
	}
	return m
}

// blocked is a refusal by policy: REFUSED (a stub resolver does not cache
// it as a negative answer) with Extended DNS Error 15, Blocked.
func blocked(req *dns.Msg, rcode int, why string) *dns.Msg {
	m := reply(req, rcode)
	text := BlockedText
	if why != "" {
		text += ": " + why
	}
	addEDE(req, m, dns.ExtendedErrorCodeBlocked, text)
	return m
}

// addEDE adds an Extended DNS Error (RFC 8914) if the query has EDNS: an
// answer may carry an OPT record only then (RFC 6891).
func addEDE(req, m *dns.Msg, code uint16, text string) {
	if req.IsEdns0() == nil {
		return
	}
	opt := m.IsEdns0()
	if opt == nil {
		m.SetEdns0(EDNSSize, false)
		opt = m.IsEdns0()
	}
	opt.Option = append(opt.Option, &dns.EDNS0_EDE{InfoCode: code, ExtraText: text})
}

// errUpstream: no upstream gave an answer.
var errUpstream = errors.New("no upstream answered")

// exchange asks the upstreams, in order, for name and qtype: over UDP,
// again over TCP when the answer is truncated. A failure, SERVFAIL or
// REFUSED moves on to the next upstream.
func (p *Proxy) exchange(ctx context.Context, name string, qtype uint16) (*dns.Msg, error) {
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), qtype)
	q.SetEdns0(EDNSSize, false)
	var errs []error
	for _, u := range p.upstreams {
		if ctx.Err() != nil {
			break
		}
		r, err := p.exchangeOne(ctx, q, u)
		if err == nil {
			switch {
			case len(r.Question) != 1 || !equalName(r.Question[0].Name, q.Question[0].Name) || r.Question[0].Qtype != qtype:
				err = fmt.Errorf("answer to another question %v", r.Question)
			case r.Rcode != dns.RcodeSuccess && r.Rcode != dns.RcodeNameError:
				err = fmt.Errorf("rcode %s", dns.RcodeToString[r.Rcode])
			default:
				return r, nil
			}
		}
		errs = append(errs, fmt.Errorf("%s: %w", u, err))
	}
	if ctx.Err() != nil {
		errs = append(errs, ctx.Err())
	}
	return nil, fmt.Errorf("%w for %s %s: %w", errUpstream, name, dns.TypeToString[qtype], errors.Join(errs...))
}

func (p *Proxy) exchangeOne(ctx context.Context, q *dns.Msg, upstream string) (*dns.Msg, error) {
	c := dns.Client{Net: "udp", Timeout: p.cfg.UpstreamTimeout, UDPSize: EDNSSize}
	r, _, err := c.ExchangeContext(ctx, q, upstream)
	if err == nil && r.Truncated {
		c.Net = "tcp"
		r, _, err = c.ExchangeContext(ctx, q, upstream)
	}
	return r, err
}

func equalName(a, b string) bool {
	return dns.CanonicalName(a) == dns.CanonicalName(b)
}
