package ktest

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ti-mo/conntrack"
	"golang.org/x/sys/unix"
)

// Probe is one connection attempt from inside a guest (busybox, e.g. in a
// runsc sandbox): TCP is a connect with nc, UDP one datagram (a tftp read
// request: busybox has no UDP netcat).
type Probe struct {
	Proto string // "tcp" or "udp"
	Dst   netip.Addr
	Port  uint16
	// Src, when valid, is the source address a TCP probe binds (nc -s): a
	// spoofing attempt, an address that is not the guest's.
	Src netip.Addr
}

func (p Probe) String() string {
	s := fmt.Sprintf("%s %v %d", p.Proto, p.Dst, p.Port)
	if p.Src.IsValid() {
		s += fmt.Sprintf(" from %v", p.Src)
	}
	return s
}

// TCPProbe and UDPProbe are probes to a:port.
func TCPProbe(a netip.Addr, port uint16) Probe { return Probe{Proto: "tcp", Dst: a, Port: port} }
func UDPProbe(a netip.Addr, port uint16) Probe { return Probe{Proto: "udp", Dst: a, Port: port} }

// ProbeTimeout is a probe's default timeout. Probes run in a slow guest
// (ptrace platform, TCG, a CPU limit, a starved CI machine, all probes at
// once) whose processes may take seconds to start: 3 s cut allowed probes
// off before their handshake or datagram. A round does not wait it out:
// it ends as soon as every probe's outcome is known.
const ProbeTimeout = 30 * time.Second

// StopPort is the TCP port a probe round's guest listens on for the test's
// signal that the round is over.
const StopPort = 7999

// Prober runs probe rounds from one guest.
type Prober struct {
	// Exec runs `sh -c script` in the guest and returns its output; a
	// non-zero exit is an error.
	Exec func(ctx context.Context, script string) (string, error)
	// Host is the test host the probes go to (its hits say what reached it).
	Host *TestHost
	// Capture is on the host end of the guest's veth: what it saw arriving
	// proves a probe left the guest.
	Capture *Capture
	// Guest are the guest's own addresses.
	Guest []netip.Addr
	// Timeout is each probe's timeout; 0 means ProbeTimeout.
	Timeout time.Duration
}

// ProbeResult is what became of one probe.
type ProbeResult struct {
	// Sent: a packet of the probe crossed the guest's veth (from the
	// guest's address, or the probe's Src, to its destination).
	Sent bool
	// Reached: the test host received it (accepted the connection or got
	// the datagram).
	Reached bool
	// Through: it passed the node's firewall: it reached the host, or the
	// kernel confirmed a conntrack flow for it (only a packet that a
	// filter hook accepted confirms one; a dropped one never does).
	Through bool
	Line    string // the guest's output for it
}

// Expect runs every probe at once from the guest and fails t for each
// whose outcome is not the wanted one: each of reach must reach the test
// host; each of blocked must have left the guest (seen on its veth) and
// not passed the firewall. A round ends when every outcome is known
// (reach: the host got it; blocked: its packet was seen, so a leak would
// already have a conntrack flow), or when the probes time out; the
// guest's probes still waiting are then stopped. Probes whose outcome a
// round left unknown (a reach that did not arrive, a blocked one never
// seen: a starved guest's IPv6 neighbour discovery can time out, "No
// route to host") get one more round of their own, logged.
func (p *Prober) Expect(t testing.TB, reach, blocked []Probe) map[Probe]ProbeResult {
	t.Helper()
	got, diag := p.round(t, reach, blocked)
	var reach2, blocked2 []Probe
	for _, pr := range reach {
		if !got[pr].Reached {
			reach2 = append(reach2, pr)
		}
	}
	for _, pr := range blocked {
		if !got[pr].Sent && !got[pr].Through {
			blocked2 = append(blocked2, pr)
		}
	}
	if len(reach2)+len(blocked2) > 0 {
		t.Logf("probe round: outcome unknown for %v: one more round for them", slices.Concat(reach2, blocked2))
		again, diag2 := p.round(t, reach2, blocked2)
		for pr, r := range again {
			r.Through = r.Through || got[pr].Through
			got[pr] = r
		}
		diag += "\nsecond round:\n" + diag2
	}
	for _, pr := range reach {
		if !got[pr].Reached {
			t.Errorf("%v from %v is blocked, want it to reach the test host (sent: %v, guest: %q)", pr, p.Guest, got[pr].Sent, got[pr].Line)
		}
	}
	for _, pr := range blocked {
		r := got[pr]
		if r.Through {
			t.Errorf("%v from %v got through (reached the host: %v), want it blocked", pr, p.Guest, r.Reached)
		}
		if !r.Sent {
			t.Errorf("%v from %v never left the guest (not seen on %s): its \"blocked\" proves nothing (guest: %q)", pr, p.Guest, p.Capture.Link, r.Line)
		}
	}
	if t.Failed() {
		t.Log(diag)
	}
	return got
}

// round runs one round of probes (reach: those that should reach the
// host) and returns each one's result and what to log on failure.
func (p *Prober) round(t testing.TB, reach, blocked []Probe) (map[Probe]ProbeResult, string) {
	t.Helper()
	probes := slices.Concat(reach, blocked)
	timeout := p.Timeout
	if timeout == 0 {
		timeout = ProbeTimeout
	}
	secs := int((timeout + time.Second - 1) / time.Second)
	// One process per probe (a guest under ptrace and TCG starts a process
	// in about a second when busy: a subshell per probe made rounds of a
	// dozen probes last 30 s). The output is read back with shell builtins.
	var script strings.Builder
	script.WriteString("d=$(mktemp -d)\n")
	for i, pr := range probes {
		switch pr.Proto {
		case "tcp":
			src := ""
			if pr.Src.IsValid() {
				src = "-s " + pr.Src.String() + " "
			}
			fmt.Fprintf(&script, "nc -w %d %s%s %d </dev/null >$d/P%d 2>&1 &\n", secs, src, pr.Dst, pr.Port, i)
		case "udp":
			if pr.Src.IsValid() {
				t.Fatalf("probe %v: a UDP probe cannot bind a source address", pr)
			}
			// tftp gives up on its own after its retries; a round kills it
			// once its datagram was seen.
			fmt.Fprintf(&script, "tftp -g -r probe -l /dev/null %s %d >$d/P%d 2>&1 &\n", pr.Dst, pr.Port, i)
		default:
			t.Fatalf("probe %v: unknown protocol", pr)
		}
	}
	// The round's end: the test connects to this listener once every
	// outcome is known (cheaper than a second exec, which takes seconds
	// under TCG); the rest of the probes would only wait out their
	// timeouts. It gives up by itself after the probes' timeout.
	fmt.Fprintf(&script, "timeout %d nc -l -p %d </dev/null >/dev/null 2>&1\nkillall nc tftp 2>/dev/null\nwait\n", secs+30, StopPort)
	for i := range probes {
		fmt.Fprintf(&script, "l=; read -r l <$d/P%d; echo \"P%d: $l\"\n", i, i)
	}
	script.WriteString("rm -r $d\n")

	hitsBefore, pktsBefore := len(p.Host.Hits()), len(p.Capture.Packets())
	start := time.Now()
	// A bound for a guest that never runs the script; a slow one ends the
	// round by itself: its stop listener gives up after the probes'
	// timeout (counted from when the guest got there, not from now).
	ctx, cancel := context.WithTimeout(context.Background(), timeout+5*time.Minute)
	defer cancel()
	type execResult struct {
		out string
		err error
	}
	done := make(chan execResult, 1)
	go func() {
		out, err := p.Exec(ctx, script.String())
		done <- execResult{out, err}
	}()

	sent := func(pr Probe) bool {
		srcs := p.Guest
		if pr.Src.IsValid() {
			srcs = []netip.Addr{pr.Src}
		}
		for _, x := range p.Capture.Packets()[pktsBefore:] {
			if x.In && x.Proto == pr.Proto && x.Dst == netip.AddrPortFrom(pr.Dst, pr.Port) && slices.Contains(srcs, x.Src.Addr()) {
				return true
			}
		}
		return false
	}
	reached := func(pr Probe) bool {
		for _, h := range p.Host.Hits()[hitsBefore:] {
			if h.Proto == pr.Proto && h.Local == netip.AddrPortFrom(pr.Dst, pr.Port) {
				return true
			}
		}
		return false
	}
	// when is when each probe's outcome became known.
	when := map[Probe]time.Duration{}
	settled := func() bool {
		all := true
		for i, pr := range probes {
			if _, ok := when[pr]; ok {
				continue
			}
			if (i < len(reach) && reached(pr)) || (i >= len(reach) && sent(pr)) {
				when[pr] = time.Since(start)
				continue
			}
			all = false
		}
		return all
	}

	// Wait for every outcome, or for the round to end on its own.
	var res execResult
	ended := false
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
wait:
	for {
		select {
		case res = <-done:
			ended = true
			break wait
		case <-tick.C:
			if settled() {
				break wait
			}
		}
	}
	settledIn := time.Since(start)
	if !ended {
		// Stop the round: connect to the guest's stop listener (from the
		// node: replies to it are established flows, which every policy
		// lets out). It may not be listening yet: retry until the round
		// ends on its own.
		stop := netip.AddrPortFrom(p.Guest[0], StopPort)
		for !ended {
			if c, err := net.DialTimeout("tcp", stop.String(), time.Second); err == nil {
				c.Close()
				break
			}
			select {
			case res = <-done:
				ended = true
			case <-time.After(100 * time.Millisecond):
			}
		}
		if !ended {
			select {
			case res = <-done:
			case <-ctx.Done():
				t.Fatalf("probe round: the guest's probes did not end after the stop at %v (waited %v)", stop, time.Since(start))
			}
		}
	}
	var slow []string
	for _, pr := range probes {
		if d, ok := when[pr]; ok && d > settledIn/2 {
			slow = append(slow, fmt.Sprintf("%v at %.1fs", pr, d.Seconds()))
		}
	}
	t.Logf("probe round: %d probes, outcomes known after %.1fs (the later half: %s), round ended after %.1fs", len(probes), settledIn.Seconds(), strings.Join(slow, ", "), time.Since(start).Seconds())
	if res.err != nil {
		t.Fatalf("probes in the guest: %v:\n%s", res.err, res.out)
	}

	flows, err := ConfirmedFlows()
	if err != nil {
		t.Fatal(err)
	}
	got := map[Probe]ProbeResult{}
	lines := map[string]string{}
	for _, l := range strings.Split(res.out, "\n") {
		if k, v, ok := strings.Cut(l, ": "); ok {
			lines[k] = v
		}
	}
	for i, pr := range probes {
		r := ProbeResult{Sent: sent(pr), Reached: reached(pr), Line: lines[fmt.Sprintf("P%d", i)]}
		srcs := p.Guest
		if pr.Src.IsValid() {
			srcs = []netip.Addr{pr.Src}
		}
		r.Through = r.Reached || slices.ContainsFunc(flows, func(f Flow) bool {
			return f.Proto == pr.Proto && f.Dst == netip.AddrPortFrom(pr.Dst, pr.Port) && slices.Contains(srcs, f.Src.Addr())
		})
		got[pr] = r
	}
	diag := fmt.Sprintf("guest output:\n%s\ntest host hits: %v\npackets on %s: %v", res.out, p.Host.Hits()[hitsBefore:], p.Capture.Link, p.Capture.Packets()[pktsBefore:])
	if err := p.Capture.Err(); err != nil {
		diag += fmt.Sprintf("\ncapture: %v", err)
	}
	return got, diag
}

// Flow is a conntrack flow by its original direction.
type Flow struct {
	Proto    string // "tcp" or "udp"
	Src, Dst netip.AddrPort
}

// ConfirmedFlows lists the TCP and UDP flows of the test netns's conntrack
// table (a dump returns only confirmed flows: those whose packet passed
// every filter hook; a dropped packet's flow is never confirmed).
func ConfirmedFlows() ([]Flow, error) {
	c, err := conntrack.Dial(nil)
	if err != nil {
		return nil, fmt.Errorf("dial conntrack: %w", err)
	}
	defer c.Close()
	fs, err := c.Dump(nil)
	if err != nil {
		return nil, fmt.Errorf("dump conntrack: %w", err)
	}
	var out []Flow
	for _, f := range fs {
		o := f.TupleOrig
		var proto string
		switch o.Proto.Protocol {
		case unix.IPPROTO_TCP:
			proto = "tcp"
		case unix.IPPROTO_UDP:
			proto = "udp"
		default:
			continue
		}
		out = append(out, Flow{proto, netip.AddrPortFrom(o.IP.SourceAddress.Unmap(), o.Proto.SourcePort), netip.AddrPortFrom(o.IP.DestinationAddress.Unmap(), o.Proto.DestinationPort)})
	}
	return out, nil
}

// FlowConfirmed says whether the test netns's conntrack holds a confirmed
// flow of proto from src (any port) to dst: whether a packet of it passed
// every filter hook.
func FlowConfirmed(proto string, src netip.Addr, dst netip.AddrPort) (bool, error) {
	fs, err := ConfirmedFlows()
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(fs, func(f Flow) bool { return f.Proto == proto && f.Src.Addr() == src && f.Dst == dst }), nil
}
