// Package dnsproxy is the sandboxes' DNS proxy (docs/network-design.md,
// section 7): every sandbox's port-53 traffic to its gateway is
// redirected by nft to one udp+tcp listener here. The proxy finds the
// sandbox by the query's source address (anti-spoofed by its chain),
// answers only names its policy allows, forwards A and AAAA to the node's
// resolvers, checks the CNAME chain of the answer, drops addresses in the
// policy's denied ranges, and puts the rest into the sandbox's domain sets
// (Allower) before the answer leaves, so the guest's first packet to an
// answered address already passes the firewall.
package dnsproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/netpolicy"
)

// Allower puts resolved addresses into a generation's domain set number
// set (an index of Effective.Domains) with the element timeout ttl. The
// nft Firewall is one. The proxy answers only after it returns.
type Allower interface {
	AllowResolved(ctx context.Context, o netpolicy.Owner, set int, addrs []netip.Addr, ttl time.Duration) error
}

// Defaults of Config.
const (
	DefaultResolvConf      = "/etc/resolv.conf"
	DefaultUpstreamTimeout = 2 * time.Second
	DefaultQueryTimeout    = 4 * time.Second
	DefaultMaxInFlight     = 256
	DefaultMaxPerSandbox   = 32
	// DefaultQueryRate and DefaultQueryBurst are a sandbox's query rate
	// (queries a second) and burst: a package install's lookups fit, a
	// flood of invented names is refused.
	DefaultQueryRate  = 50
	DefaultQueryBurst = 200
	// DefaultMaxAddrsPerSandbox is Config.MaxAddrsPerSandbox's default:
	// the size of one domain set.
	DefaultMaxAddrsPerSandbox = netpolicy.DomainSetSize
	// DefaultElementMinTTL and DefaultElementGrace are the defaults of
	// Config.ElementMinTTL and Config.ElementGrace.
	DefaultElementMinTTL = 5 * time.Second
	DefaultElementGrace  = 30 * time.Second
	// MaxElementGrace bounds Config.ElementGrace: a destination a name
	// no longer answers closes within MaxTTL + MaxElementGrace.
	MaxElementGrace = time.Hour
)

// Answer limits and timeouts of set elements.
const (
	// MaxChain is the most CNAME links an answer may have.
	MaxChain = 8
	// MaxAddrs bounds the addresses one answer puts into the sets (and
	// gives the guest): it bounds what one query adds to the kernel.
	MaxAddrs = 32
	// MaxTTL caps an answer's TTL, for the set elements and the guest
	// (Config.ElementMinTTL is the floor of the elements').
	MaxTTL = time.Hour
	// EDNSSize is the UDP payload size the proxy offers and asks for
	// (the DNS flag day 2020 value: no IP fragmentation).
	EDNSSize = 1232
	// BlockedText is the Extended DNS Error text of a refused name.
	BlockedText = "ctld network policy"
	// RateLimitedText and AddrCapText follow BlockedText in the Extended
	// DNS Error (code 0, Other: RFC 8914 has no code for either) of a
	// query over the sandbox's rate and of an answer past its address cap.
	RateLimitedText = "query rate limit"
	AddrCapText     = "cap of resolved addresses reached"
)

// Config configures a Proxy.
type Config struct {
	// Listen is the address of both listeners, host:port. An empty host
	// listens on every address of both families (the nft redirect sends
	// a sandbox's query to the address of its gateway link). Port 0
	// picks a free port, the same for udp and tcp.
	Listen string
	// Pool is the node's sandbox address pool: a query's source address
	// names its slot.
	Pool netpolicy.Pool
	// Upstreams are the resolvers the proxy forwards to, host:port or a
	// bare address (port 53), tried in order. Empty: the nameservers of
	// ResolvConf.
	Upstreams []string
	// ResolvConf is read when Upstreams is empty (DefaultResolvConf).
	ResolvConf string
	// Allower puts answered addresses into the sandboxes' domain sets.
	Allower Allower
	Logger  *slog.Logger
	// UpstreamTimeout bounds one exchange with one upstream.
	UpstreamTimeout time.Duration
	// QueryTimeout bounds a whole query: upstreams, following a CNAME
	// chain and the Allower.
	QueryTimeout time.Duration
	// MaxInFlight bounds the queries worked on at once, MaxPerSandbox
	// those of one sandbox; a query beyond either is dropped (the
	// guest's resolver retries).
	MaxInFlight   int
	MaxPerSandbox int
	// QueryRate (queries a second) and QueryBurst are a token bucket per
	// sandbox: a query beyond it is answered REFUSED with an Extended
	// DNS Error, without asking an upstream. Zero: DefaultQueryRate,
	// DefaultQueryBurst.
	QueryRate  float64
	QueryBurst int
	// MaxAddrsPerSandbox caps the distinct addresses the proxy keeps in
	// one generation's domain sets (all sets, both families) until they
	// expire; an answer that would pass it is refused with SERVFAIL and
	// adds nothing (limits.go says why refuse, not evict). Zero:
	// DefaultMaxAddrsPerSandbox. Set it at most the firewall's domain
	// set size, or the kernel refuses first (the answer fails the same).
	MaxAddrsPerSandbox int
	// Now is the clock of the rate limit and the address cap (nil:
	// time.Now).
	Now func() time.Time
	// A set element lives min(max(TTL, ElementMinTTL), MaxTTL) +
	// ElementGrace. The floor keeps a destination open across a failover
	// and a slow guest's next lookup even for TTL 0 answers; the grace
	// lets an element outlive the guest's cache of the answer. Zero:
	// DefaultElementMinTTL, DefaultElementGrace; ElementMinTTL at most
	// MaxTTL, ElementGrace at most MaxElementGrace.
	ElementMinTTL time.Duration
	ElementGrace  time.Duration
	// Observe, if set, is told of each query once handled: the rcode of
	// its answer, or dropped (left unanswered over the in-flight bounds).
	// For metrics; it must not block.
	Observe func(rcode int, dropped bool)
}

// Proxy is the DNS proxy and its registry of generations. Its zero value
// is not usable; make one with New.
type Proxy struct {
	cfg       Config
	upstreams []string
	log       *slog.Logger
	slots     chan struct{} // MaxInFlight tokens

	mu       sync.RWMutex
	entries  map[netpolicy.Slot]*entry
	inflight map[netpolicy.Slot]int

	lmu     sync.Mutex
	udp     net.PacketConn
	tcp     net.Listener
	serving bool
	closed  chan struct{}
	closing sync.Once
}

// entry is one registered generation.
type entry struct {
	owner netpolicy.Owner
	eff   netpolicy.Effective
	sets  []matcher // per Effective.Domains
	use   *usage    // the generation's rate and address account

	// mu is held for reading across a query's Allower calls and taken
	// for writing when the entry is replaced or removed (retired), so
	// Register and Unregister return only after the last Allower call
	// of the entry they retire.
	mu      sync.RWMutex
	retired bool
}

// retire marks e replaced, after its Allower calls in flight returned.
func (e *entry) retire() {
	if e == nil {
		return
	}
	e.mu.Lock()
	e.retired = true
	e.mu.Unlock()
}

// New checks cfg and makes a proxy; it binds nothing yet (Listen, Serve).
func New(cfg Config) (*Proxy, error) {
	bad := func(format string, args ...any) error {
		return errdefs.Errorf(errdefs.CodeInvalidArgument, "dns proxy: "+format, args...)
	}
	if cfg.Allower == nil {
		return nil, bad("no Allower")
	}
	if err := cfg.Pool.Check(); err != nil {
		return nil, fmt.Errorf("dns proxy: %w", err)
	}
	if _, _, err := net.SplitHostPort(cfg.Listen); err != nil {
		return nil, bad("listen address %q: %v", cfg.Listen, err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ResolvConf == "" {
		cfg.ResolvConf = DefaultResolvConf
	}
	if cfg.UpstreamTimeout <= 0 {
		cfg.UpstreamTimeout = DefaultUpstreamTimeout
	}
	if cfg.QueryTimeout <= 0 {
		cfg.QueryTimeout = DefaultQueryTimeout
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.MaxPerSandbox <= 0 {
		cfg.MaxPerSandbox = DefaultMaxPerSandbox
	}
	if cfg.QueryRate < 0 || cfg.QueryBurst < 0 || cfg.MaxAddrsPerSandbox < 0 {
		return nil, bad("negative query rate %v, burst %d or address cap %d", cfg.QueryRate, cfg.QueryBurst, cfg.MaxAddrsPerSandbox)
	}
	if cfg.QueryRate == 0 {
		cfg.QueryRate = DefaultQueryRate
	}
	if cfg.QueryBurst == 0 {
		cfg.QueryBurst = DefaultQueryBurst
	}
	if cfg.MaxAddrsPerSandbox == 0 {
		cfg.MaxAddrsPerSandbox = DefaultMaxAddrsPerSandbox
	}
	if cfg.MaxAddrsPerSandbox < MaxAddrs {
		return nil, bad("address cap %d: want at least %d (one answer)", cfg.MaxAddrsPerSandbox, MaxAddrs)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.ElementMinTTL < 0 || cfg.ElementMinTTL > MaxTTL {
		return nil, bad("element TTL floor %v: want at most %v", cfg.ElementMinTTL, MaxTTL)
	}
	if cfg.ElementGrace < 0 || cfg.ElementGrace > MaxElementGrace {
		return nil, bad("element grace %v: want at most %v", cfg.ElementGrace, MaxElementGrace)
	}
	if cfg.ElementMinTTL == 0 {
		cfg.ElementMinTTL = DefaultElementMinTTL
	}
	if cfg.ElementGrace == 0 {
		cfg.ElementGrace = DefaultElementGrace
	}
	ups := cfg.Upstreams
	if len(ups) == 0 {
		rc, err := dns.ClientConfigFromFile(cfg.ResolvConf)
		if err != nil {
			return nil, bad("no upstreams configured and reading %s: %v", cfg.ResolvConf, err)
		}
		for _, s := range rc.Servers {
			ups = append(ups, net.JoinHostPort(s, rc.Port))
		}
	}
	var upstreams []string
	for _, u := range ups {
		hp, err := upstreamAddr(u)
		if err != nil {
			return nil, bad("upstream %q: %v", u, err)
		}
		upstreams = append(upstreams, hp)
	}
	if len(upstreams) == 0 {
		return nil, bad("no upstream resolvers (none configured, none in %s)", cfg.ResolvConf)
	}
	return &Proxy{
		cfg:       cfg,
		upstreams: upstreams,
		log:       cfg.Logger,
		slots:     make(chan struct{}, cfg.MaxInFlight),
		entries:   map[netpolicy.Slot]*entry{},
		inflight:  map[netpolicy.Slot]int{},
		closed:    make(chan struct{}),
	}, nil
}

// upstreamAddr normalizes "host:port" or a bare address to host:port.
func upstreamAddr(s string) (string, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.String(), nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return netip.AddrPortFrom(a, 53).String(), nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return "", err
	}
	if host == "" || port == "" {
		return "", errors.New("want host:port")
	}
	return s, nil
}

// Upstreams returns the resolvers the proxy forwards to.
func (p *Proxy) Upstreams() []string { return append([]string(nil), p.upstreams...) }

// Register makes (or replaces) the entry of o's slot: queries from
// o.Block's sandbox addresses are answered by eff from now on. It returns
// after the replaced entry's Allower calls in flight have returned; a
// query that was still waiting for its upstream is decided again by eff.
// So on a live update, Register the new policy before the firewall
// applies it: no answer of the old policy is added after that.
func (p *Proxy) Register(o netpolicy.Owner, eff netpolicy.Effective) {
	e := &entry{owner: o, eff: eff}
	for _, ds := range eff.Domains {
		e.sets = append(e.sets, compile(ds))
	}
	p.mu.Lock()
	old := p.entries[o.Block.Slot]
	// A live update keeps the generation's account (its sets keep their
	// elements or lose them: counting them on is the safe side); a new
	// generation starts with empty sets and a full bucket.
	if old != nil && old.owner == o {
		e.use = old.use
	} else {
		e.use = newUsage(p.cfg.QueryBurst, p.cfg.Now())
	}
	p.entries[o.Block.Slot] = e
	p.mu.Unlock()
	old.retire()
}

// Unregister removes slot's entry (absent is success): its queries are
// refused from now on. Like Register it returns after the entry's
// Allower calls in flight have returned: after it, the proxy adds
// nothing more to the generation's sets.
func (p *Proxy) Unregister(slot netpolicy.Slot) {
	p.mu.Lock()
	old := p.entries[slot]
	delete(p.entries, slot)
	p.mu.Unlock()
	old.retire()
}

// hold returns the entry current for e's slot, read-locked (release
// unlocks it): e itself unless it was retired meanwhile; nil if the slot
// has no entry any more.
func (p *Proxy) hold(e *entry) (cur *entry, release func()) {
	for e != nil {
		e.mu.RLock()
		if !e.retired {
			return e, e.mu.RUnlock
		}
		e.mu.RUnlock()
		p.mu.RLock()
		e = p.entries[e.owner.Block.Slot]
		p.mu.RUnlock()
	}
	return nil, func() {}
}

// Registered reports whether slot has an entry.
func (p *Proxy) Registered(slot netpolicy.Slot) bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.entries[slot] != nil
}

// lookup finds the generation that sends from src: its slot's entry, if
// src is that block's sandbox address (not its gateway, which is the
// node's).
func (p *Proxy) lookup(src netip.Addr) *entry {
	src = src.Unmap()
	slot, ok := p.cfg.Pool.SlotOf(src)
	if !ok {
		return nil
	}
	p.mu.RLock()
	e := p.entries[slot]
	p.mu.RUnlock()
	if e == nil || (src != e.owner.Block.Addr4 && src != e.owner.Block.Addr6) {
		return nil
	}
	return e
}

// Listen binds the udp and tcp listeners on Config.Listen (the same port
// for both). Serve calls it if it was not called; calling it first lets a
// caller see a bind error before it serves.
func (p *Proxy) Listen() error {
	p.lmu.Lock()
	defer p.lmu.Unlock()
	if p.udp != nil {
		return nil
	}
	select {
	case <-p.closed:
		return errdefs.Errorf(errdefs.CodeUnavailable, "dns proxy: closed")
	default:
	}
	host, want, _ := net.SplitHostPort(p.cfg.Listen)
	// With port 0 the kernel picks a free UDP port, and that port may be
	// taken for TCP: pick again a few times rather than fail.
	tries := 1
	if want == "0" {
		tries = 8
	}
	var err error
	for range tries {
		var pc net.PacketConn
		pc, err = net.ListenPacket("udp", p.cfg.Listen)
		if err != nil {
			return fmt.Errorf("dns proxy: %w", err) // "listen udp <addr>: ..."
		}
		port := pc.LocalAddr().(*net.UDPAddr).Port
		var l net.Listener
		l, err = net.Listen("tcp", net.JoinHostPort(host, fmt.Sprint(port)))
		if err == nil {
			p.udp, p.tcp = pc, l
			return nil
		}
		pc.Close()
		err = fmt.Errorf("dns proxy: port %d of udp: %w", port, err)
		if !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	return err
}

// bindRetry is how often Serve tries again to bind a port in use.
const bindRetry = 100 * time.Millisecond

// listenWait is Listen, retried while the port is in use: after a
// failover the previous primary (frozen, or still stopping) may hold it
// until it exits, and the new one must serve as soon as it is free.
func (p *Proxy) listenWait(ctx context.Context) error {
	for logged := false; ; logged = true {
		err := p.Listen()
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) {
			return err
		}
		if !logged {
			p.log.Warn("dns proxy: port in use, retrying until it is free", "listen", p.cfg.Listen, "every", bindRetry, "err", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("dns proxy: %w (gave up: %w)", err, ctx.Err())
		case <-p.closed:
			return nil
		case <-time.After(bindRetry):
		}
	}
}

// Addr is the bound address (after Listen): its port is the listeners'.
func (p *Proxy) Addr() netip.AddrPort {
	p.lmu.Lock()
	defer p.lmu.Unlock()
	if p.udp == nil {
		return netip.AddrPort{}
	}
	return p.udp.LocalAddr().(*net.UDPAddr).AddrPort()
}

// Serve answers queries until ctx is done or Close is called, then stops
// both listeners and waits for the queries in flight (they are cancelled).
// It returns nil after such a stop, or the error that stopped a listener.
// If the port is in use it binds as soon as it is free (Listen once first
// to fail on that instead).
func (p *Proxy) Serve(ctx context.Context) error {
	if err := p.listenWait(ctx); err != nil {
		return err
	}
	p.lmu.Lock()
	pc, l, serving := p.udp, p.tcp, p.serving
	select {
	case <-p.closed: // Close came first: it released the listeners
		p.lmu.Unlock()
		return nil
	default:
	}
	p.serving = true
	p.lmu.Unlock()
	if serving {
		return errdefs.Errorf(errdefs.CodeConflict, "dns proxy: already serving")
	}

	qctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	h := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) { p.serveDNS(qctx, w, req) })
	servers := []*dns.Server{
		// A query is a question and an OPT record: a datagram beyond
		// EDNSSize is cut and then refused as malformed, and no reader
		// holds a 64 KiB buffer.
		{PacketConn: pc, Handler: h, UDPSize: EDNSSize},
		{Listener: l, Handler: h, MaxTCPQueries: 256},
	}
	errs := make(chan error, len(servers))
	started := make(chan struct{}, len(servers))
	for _, s := range servers {
		s.NotifyStartedFunc = func() { started <- struct{}{} }
		go func() { errs <- s.ActivateAndServe() }()
	}
	// Shutdown refuses a server that has not started yet: wait for both.
	var err error
	for n := 0; n < len(servers) && err == nil; {
		select {
		case <-started:
			n++
		case err = <-errs:
		}
	}
	running := len(servers)
	if err == nil {
		select {
		case <-ctx.Done():
		case <-p.closed:
		case err = <-errs:
			running--
		}
	} else {
		running--
	}
	p.log.Info("dns proxy stopping", "addr", p.Addr(), "err", err)
	cancel()
	sctx, scancel := context.WithTimeout(context.Background(), p.cfg.QueryTimeout+time.Second)
	defer scancel()
	for _, s := range servers {
		_ = s.ShutdownContext(sctx) // an already failed server: nothing to stop
	}
	// A server that had not started when the other failed refuses
	// Shutdown; its closed listener ends it.
	p.closeListeners()
	for ; running > 0; running-- {
		if e := <-errs; e != nil && err == nil && !errors.Is(e, net.ErrClosed) {
			err = e
		}
	}
	p.closing.Do(func() { close(p.closed) })
	p.lmu.Lock()
	p.serving = false
	p.lmu.Unlock()
	p.closeListeners()
	if err != nil {
		return fmt.Errorf("dns proxy: serve: %w", err)
	}
	return nil
}

// Close stops Serve (which releases the listeners when it returns), or
// releases them if nothing serves them. Idempotent; a closed proxy does
// not serve again.
func (p *Proxy) Close() error {
	p.closing.Do(func() { close(p.closed) })
	p.lmu.Lock()
	serving := p.serving
	p.lmu.Unlock()
	if serving {
		return nil
	}
	return p.closeListeners()
}

func (p *Proxy) closeListeners() error {
	p.lmu.Lock()
	defer p.lmu.Unlock()
	var errs []error
	if p.udp != nil {
		if err := p.udp.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	if p.tcp != nil {
		if err := p.tcp.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
