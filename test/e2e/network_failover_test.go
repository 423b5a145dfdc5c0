package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/ha"
	"github.com/ctld/ctld/internal/netpolicy/dnsproxy"
)

// nftVolatile are the keys of `nft -j` output that change without a
// rule or element changing: handles (a re-added object gets a new one),
// the time an element has left, and counter values.
var nftVolatile = map[string]bool{"handle": true, "expires": true, "packets": true, "bytes": true}

// nftObjects lists table (family inet) with `nft -j` as one canonical
// JSON line per object (table, chain, rule, set with its elements, map,
// counter), volatile fields dropped and elements sorted, the lines sorted:
// two listings are equal iff the same objects with the same rules and
// elements exist, each as often.
func nftObjects(t testing.TB, table string) []string {
	t.Helper()
	objs, err := nftList(table)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func nftList(table string) ([]string, error) {
	out, err := exec.Command("nft", "-j", "list", "table", "inet", table).Output()
	if err != nil {
		return nil, fmt.Errorf("nft -j list table inet %s: %w", table, err)
	}
	var doc struct {
		Nftables []map[string]any `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return nil, fmt.Errorf("parse nft -j output: %w", err)
	}
	var objs []string
	for _, o := range doc.Nftables {
		if _, ok := o["metainfo"]; ok {
			continue
		}
		b, err := json.Marshal(canonNft(o)) // map keys come out sorted
		if err != nil {
			return nil, err
		}
		objs = append(objs, string(b))
	}
	slices.Sort(objs)
	return objs, nil
}

// canonNft drops the volatile keys and sorts element lists.
func canonNft(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, x := range v {
			if nftVolatile[k] {
				continue
			}
			x = canonNft(x)
			if xs, ok := x.([]any); ok && k == "elem" {
				slices.SortFunc(xs, func(a, b any) int {
					ja, _ := json.Marshal(a)
					jb, _ := json.Marshal(b)
					return strings.Compare(string(ja), string(jb))
				})
			}
			out[k] = x
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = canonNft(x)
		}
		return out
	}
	return v
}

// nftDiff says which objects only one of two listings has (or has more
// often), "" if they are equal.
func nftDiff(before, after []string) string {
	count := map[string]int{}
	for _, o := range before {
		count[o]--
	}
	for _, o := range after {
		count[o]++
	}
	var b strings.Builder
	for _, o := range slices.Sorted(maps.Keys(count)) {
		switch n := count[o]; {
		case n < 0:
			fmt.Fprintf(&b, "lost (%d): %s\n", -n, o)
		case n > 0:
			fmt.Fprintf(&b, "added (%d): %s\n", n, o)
		}
	}
	return b.String()
}

// duplicates are the objects a listing holds more than once.
func duplicates(objs []string) []string {
	var out []string
	for i := 1; i < len(objs); i++ {
		if objs[i] == objs[i-1] && (len(out) == 0 || out[len(out)-1] != objs[i]) {
			out = append(out, objs[i])
		}
	}
	return out
}

// guestTraffic runs in the guest until /tmp/stop exists:
//   - keep: one TCP connection to the CIDR-allowed address, a numbered line
//     every second, the host's echoes in /tmp/keep.log;
//   - dns: a lookup of a new name below cdn.e2e.test every second, "ok N" /
//     "fail N" in /tmp/dns.log (busybox nslookup exits 1 without an
//     answer); each name qN is new, so the upstream's log says when the
//     proxy forwarded it;
//   - allowed: new connections to the address of api.e2e.test, which the
//     guest resolved once before the traffic started and never again (only
//     the set element from before the kill lets them through), to the
//     address of *.cdn.e2e.test (refreshed by the lookups) and to the
//     CIDR-allowed one;
//   - denied: new connections to an address of a refused name.
const guestTraffic = `
(i=0; while [ ! -e /tmp/stop ]; do i=$((i+1)); echo keep$i; sleep 1; done) | nc %[1]s 8080 > /tmp/keep.log 2>&1 &
(i=0; while [ ! -e /tmp/stop ]; do i=$((i+1))
  if nslookup -type=a q$i.cdn.e2e.test > /dev/null 2>&1; then echo "ok $i"; else echo "fail $i"; fi
  sleep 1; done > /tmp/dns.log 2>&1) &
(while [ ! -e /tmp/stop ]; do
  nc -w 10 %[4]s 8080 < /dev/null > /dev/null 2>&1; nc -w 10 %[2]s 8080 < /dev/null > /dev/null 2>&1; nc -w 10 %[1]s 8080 < /dev/null > /dev/null 2>&1; sleep 1; done) &
(while [ ! -e /tmp/stop ]; do nc -w 3 %[3]s 8080 < /dev/null > /dev/null 2>&1; sleep 1; done) &
`

// failoverElementFloor is the test's --dns-element-min-ttl: the test
// DNS server's TTL of 2 s would give its answers' set elements 35 s,
// shorter than a failover plus a starved guest's next lookup can take
// under TCG; with the floor every element from before the kill lives
// past the end of the test, so a destination that closes is a lost
// element, not an expired one.
const failoverElementFloor = 20 * time.Minute

var (
	keepLine = regexp.MustCompile(`(?m)^keep(\d+) from `)
	dnsLine  = regexp.MustCompile(`(?m)^(ok|fail) (\d+)$`)
)

// TestNetworkFailoverMidTraffic: a restricted guest keeps a TCP connection
// open, resolves names through the proxy and opens new connections, allowed
// and denied, while the primary is killed with SIGKILL. The standby takes
// over; the open connection carries every line across the failover, the
// proxy answers again (measured), allowed destinations stay reachable and
// the denied one is never reached; the table holds the same objects and
// elements, one copy each, during the takeover and after it. Then a
// window with no ctld at all (the restarted a frozen as standby, b
// killed): the kernel alone keeps the open connection and the set elements
// from before the kills working and the denied address closed, until a
// thaws and takes over.
func TestNetworkFailoverMidTraffic(t *testing.T) {
	e := newEnv(t)
	s := newDNSSetup(t)
	e.args = append(e.args, "--dns-upstream", s.DNS.Addr.String(), "--dns-element-min-ttl", failoverElementFloor.String())
	// The setup's positive control (from the node) connected once.
	evilAtStart := hostHits(s.Host, s.Evil)
	e.start("a")
	na := e.waitPrimary("a", 60*time.Second)
	e.start("b")
	e.waitRole("b", ha.RoleStandby, 60*time.Second)
	c := e.client()
	cx := ctx(t, 10*time.Minute)
	t0 := time.Now()

	req := claimReq("claim-fo", 1)
	req.Resources.PIDs, req.Resources.MemoryBytes = 1024, 512<<20
	req.Network = dnsPolicy(s.Host.Addr4.String() + "/32")
	if _, err := c.Claim(cx, "fo", req); err != nil {
		t.Fatalf("claim: %v", err)
	}
	claimed := time.Now()
	e.checkNodeResolver(cx, "fo")
	r := e.lookup(cx, "fo", "api.e2e.test", "x.cdn.e2e.test")
	if !slices.Equal(r["x.cdn.e2e.test"].Addrs, []netip.Addr{s.CDN}) || !slices.Equal(r["api.e2e.test"].Addrs, []netip.Addr{s.API}) {
		t.Fatalf("nslookup x.cdn.e2e.test = %+v, api.e2e.test = %+v", r["x.cdn.e2e.test"], r["api.e2e.test"])
	}
	// The floor is ctld's setting: the elements live floor + grace.
	wantTimeout := failoverElementFloor + dnsproxy.DefaultElementGrace
	els := domainSetElements(t, e.nftTable, "fo", 1)
	if len(els) != 2 {
		t.Errorf("domain set elements after the lookups: %v, want %v and %v", els, s.API, s.CDN)
	}
	for _, el := range els {
		if el.Timeout != wantTimeout {
			t.Errorf("set element %v: timeout %v, want %v (--dns-element-min-ttl %v + the default grace)", el.Addr, el.Timeout, wantTimeout, failoverElementFloor)
		}
	}
	apiAsked := askedCount(s.DNS, "api.e2e.test")
	// The traffic runs detached, in a session of its own: an exec's process
	// group is killed when the exec ends or its caller goes away, and the
	// primary's death ends every exec it served. The shell forks setsid
	// (the "; exit 0" keeps it from exec'ing its last command, which would
	// make setsid the group leader: setsid(1) would then fork and return,
	// racing its child's setsid(2) against the agent's group kill); so
	// setsid is no group leader, calls setsid(2) and execs the script's
	// shell, which leaves the loops in the new session and exits. Their
	// output goes to files, so the exec holds no pipe of them and returns.
	if r, err := c.Exec(cx, "fo", api.ExecRequest{Args: []string{"/bin/sh", "-c", `setsid /bin/sh -c "$0" < /dev/null > /dev/null 2>&1; exit $?`,
		fmt.Sprintf(guestTraffic, s.Host.Addr4, s.CDN, s.Evil, s.API)}}); err != nil || r.ExitCode != 0 {
		t.Fatalf("start the guest's traffic: %v (exit %d: %s)", err, r.ExitCode, r.Stderr)
	}

	// readLog reads both logs at once (an exec in the busy guest takes
	// up to half a minute under TCG); their lines do not mix.
	readLog := func(string) string {
		t.Helper()
		// Through the guest: its /tmp is gVisor's own.
		// Not there yet: the traffic's exec may not have started.
		r, err := c.Exec(cx, "fo", api.ExecRequest{Args: []string{"/bin/sh", "-c", "cat /tmp/keep.log /tmp/dns.log 2>/dev/null || true"}})
		if err != nil || r.ExitCode != 0 {
			t.Fatalf("read the logs of the guest: %+v, %v", r, err)
		}
		return string(r.Stdout)
	}
	maxKeep := func() int {
		n := 0
		for _, m := range keepLine.FindAllStringSubmatch(readLog("keep.log"), -1) {
			i, _ := strconv.Atoi(m[1])
			n = max(n, i)
		}
		return n
	}
	oks := func() int { return strings.Count(readLog("dns.log"), "ok ") }
	// state says what the guest's traffic did, for a wait that times out.
	state := func() string {
		logs := "(unreadable)"
		if r, err := c.Exec(cx, "fo", api.ExecRequest{Args: []string{"/bin/sh", "-c", "cat /tmp/keep.log /tmp/dns.log 2>&1; ps"}}); err == nil {
			logs = string(r.Stdout)
		}
		return fmt.Sprintf("host hits: cdn %d, api %d, cidr %d; upstream queries %d; guest logs and processes:\n%s",
			hostHits(s.Host, s.CDN), hostHits(s.Host, s.API), hostHits(s.Host, s.Host.Addr4), len(s.DNS.Queries()), logs)
	}
	waitFor(t, 4*time.Minute, "the guest's connection to echo and its lookups to answer", func() bool {
		return maxKeep() >= 2 && oks() >= 2 && hostHits(s.Host, s.CDN) >= 2 && hostHits(s.Host, s.API) >= 2
	}, state)
	running := time.Now()

	before := nftObjects(t, e.nftTable)
	if d := duplicates(before); len(d) > 0 {
		t.Errorf("the table holds objects twice before the failover:\n%s", strings.Join(d, "\n"))
	}
	chain := `"name":"sb-fo-g1"`
	if !slices.ContainsFunc(before, func(o string) bool { return strings.Contains(o, chain) }) {
		t.Fatalf("no chain sb-fo-g1 in the table:\n%s", strings.Join(before, "\n"))
	}
	keepAtKill, queriesAtKill, droppedAtKill := maxKeep(), len(s.DNS.Queries()), e.dropped(cx, "fo")
	cdnAtKill, addrAtKill, apiAtKill := hostHits(s.Host, s.CDN), hostHits(s.Host, s.Host.Addr4), hostHits(s.Host, s.API)

	// Watch the table through the takeover: every listing must equal the
	// one before (a new primary ensures its base chains and adopts the
	// generation; it must neither drop nor re-add anything).
	watch, stopWatch := context.WithCancel(cx)
	var wmu sync.Mutex
	var during []string
	listings := 0
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for watch.Err() == nil {
			now, err := nftList(e.nftTable)
			if err == nil {
				wmu.Lock()
				listings++
				if d := nftDiff(before, now); d != "" && len(during) < 3 {
					during = append(during, d)
				}
				wmu.Unlock()
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()

	// Probe the proxy's port from the node every 20 ms: the first answer
	// (REFUSED: the node is no sandbox) to a query sent after the old
	// primary died is the new primary's proxy serving.
	probe := probeProxy(watch, netip.MustParseAddrPort("127.0.0.1:10053"))

	tKill := time.Now()
	e.kill9("a")
	probe.dead(tKill, time.Now())
	nb := e.waitPrimary("b", 60*time.Second)
	tServe := time.Now()
	apiInGap, cdnInGap, addrInGap := hostHits(s.Host, s.API)-apiAtKill, hostHits(s.Host, s.CDN)-cdnAtKill, hostHits(s.Host, s.Host.Addr4)-addrAtKill
	if nb.Epoch <= na.Epoch {
		t.Fatalf("epoch after failover %d, want > %d", nb.Epoch, na.Epoch)
	}
	// The proxy serves as soon as the new primary does: a lookup now is
	// answered at its first try.
	lk := time.Now()
	if r := e.lookup(cx, "fo", "y.cdn.e2e.test")["y.cdn.e2e.test"]; !slices.Equal(r.Addrs, []netip.Addr{s.CDN}) {
		t.Errorf("nslookup right after the takeover = %v, want %v:\n%s", r.Addrs, s.CDN, r.Out)
	}
	lookupAfter := time.Since(lk)
	afterTakeover := nftObjects(t, e.nftTable)
	stopWatch()
	<-watched

	// The guest's traffic goes on: the open connection echoes more lines
	// and lost none, lookups answer, new allowed connections land.
	waitFor(t, 4*time.Minute, "the connection, lookups and new connections to go on after the failover", func() bool {
		return maxKeep() >= keepAtKill+4 && hostHits(s.Host, s.CDN) >= cdnAtKill+2 && hostHits(s.Host, s.Host.Addr4) >= addrAtKill+2 &&
			hostHits(s.Host, s.API) >= apiAtKill+2 &&
			slices.ContainsFunc(s.DNS.Queries()[queriesAtKill:], func(q dnsQuery) bool { return strings.HasPrefix(q.Name, "q") })
	}, func() string {
		return fmt.Sprintf("at the kill: keep%d, cdn %d, api %d, cidr %d hits, %d queries; now %s", keepAtKill, cdnAtKill, apiAtKill, addrAtKill, queriesAtKill, state())
	})
	keep := readLog("keep.log")
	seen := map[int]bool{}
	for _, m := range keepLine.FindAllStringSubmatch(keep, -1) {
		i, _ := strconv.Atoi(m[1])
		seen[i] = true
	}
	last := 0 // of the same read: a later one has more lines
	for i := range seen {
		last = max(last, i)
	}
	for i := 1; i <= last; i++ {
		if !seen[i] {
			t.Errorf("line keep%d never came back on the open connection (lines up to keep%d did; %d at the kill):\n%s", i, last, keepAtKill, keep)
			break
		}
	}

	// When DNS answered again: the first lookup of a name qN the
	// upstream got after the kill and the guest saw answered.
	arrived := map[int]time.Time{}
	for _, q := range s.DNS.Queries() {
		var i int
		if _, err := fmt.Sscanf(q.Name, "q%d.cdn.e2e.test.", &i); err == nil {
			if _, ok := arrived[i]; !ok {
				arrived[i] = q.At
			}
		}
	}
	dnsLog := readLog("dns.log")
	var back time.Duration
	failed := 0
	for _, m := range dnsLine.FindAllStringSubmatch(dnsLog, -1) {
		i, _ := strconv.Atoi(m[2])
		if m[1] == "fail" {
			failed++
			continue
		}
		if at, ok := arrived[i]; ok && at.After(tKill) && back == 0 {
			back = at.Sub(tKill)
		}
	}
	failover := tServe.Sub(tKill)
	if back == 0 {
		t.Errorf("no lookup of the guest's was answered after the kill:\n%s", dnsLog)
	}
	// DNS answers again within the failover time: the new primary's
	// proxy answered a query before the standby reported itself primary,
	// and (above) the guest's first lookup after that was answered: the
	// generation was registered by then.
	proxyBack, probes := probe.back()
	switch {
	case proxyBack == 0:
		t.Errorf("the proxy never answered on %v after the kill (%d probes)", probe.addr, probes)
	case proxyBack > failover:
		t.Errorf("the new primary's proxy answered %v after the kill, later than the failover (%v)", proxyBack.Round(time.Millisecond), failover.Round(time.Millisecond))
	}

	// Set elements already in the kernel keep working: the guest never
	// resolved api.e2e.test again, yet its new connections to that address
	// went on through the takeover (those within it are counted).
	if n := askedCount(s.DNS, "api.e2e.test"); n != apiAsked {
		t.Errorf("the upstream got %d queries for api.e2e.test since the traffic started, want none: the test's premise is broken", n-apiAsked)
	}
	if n := hostHits(s.Host, s.API) - apiAtKill; n < 2 {
		t.Errorf("%d new connections to %v (api.e2e.test, resolved once before the kill) since the kill, want at least 2: its set element did not carry across", n, s.API)
	}
	if !slices.Contains(domainElements(t, e.nftTable, "fo", 1), s.API) {
		t.Errorf("the set element of %v (api.e2e.test) is gone after the failover", s.API)
	}

	// Policy: nothing ever reached the denied address; the allowed ones
	// were reached after the failover (above).
	if n := hostHits(s.Host, s.Evil) - evilAtStart; n > 0 {
		t.Errorf("the denied %v accepted %d connections from the guest", s.Evil, n)
	}
	// ... and the attempts did leave the guest: its chain dropped them.
	if d := e.dropped(cx, "fo"); d <= droppedAtKill {
		t.Errorf("the sandbox dropped no packet since the kill (%d then, %d now): the denied attempts did not run", droppedAtKill, d)
	}

	// The table: the same objects and elements, one copy each, during
	// the takeover, right after it and now.
	wmu.Lock()
	t.Logf("%d listings of the table during the takeover", listings)
	for _, d := range during {
		t.Errorf("during the takeover the table differed from before:\n%s", d)
	}
	wmu.Unlock()
	if d := nftDiff(before, afterTakeover); d != "" {
		t.Errorf("right after the takeover the table differs from before:\n%s", d)
	}
	final := nftObjects(t, e.nftTable)
	if d := nftDiff(before, final); d != "" {
		t.Errorf("after the failover the table differs from before:\n%s", d)
	}
	if d := duplicates(final); len(d) > 0 {
		t.Errorf("the table holds objects twice after the failover:\n%s", strings.Join(d, "\n"))
	}
	if len(before) < 10 {
		t.Errorf("only %d objects in the table: %v", len(before), before)
	}

	t.Logf("failover: kill -9 to the standby serving %v; to the new proxy answering %v (%d probes); first guest lookup the proxy forwarded after the kill %v after it; a lookup right after the takeover took %v; %d lookups failed meanwhile; open connection lines keep%d at the kill, keep%d now, none lost; new connections within the takeover: %d to api.e2e.test (element from before the kill), %d to the cdn, %d to the CIDR; %d objects in the table, unchanged",
		failover.Round(time.Millisecond), proxyBack.Round(time.Millisecond), probes, back.Round(time.Millisecond), lookupAfter.Round(time.Millisecond), failed, keepAtKill, last,
		apiInGap, cdnInGap, addrInGap, len(before))
	t.Logf("guest seconds: claim %.1fs, traffic up %.1fs, failover and after %.1fs; total %.1fs",
		claimed.Sub(t0).Seconds(), running.Sub(claimed).Seconds(), time.Since(running).Seconds(), time.Since(t0).Seconds())

	// No primary at all, for as long as the guest needs to show what the
	// kernel alone does. The restarted a is frozen (SIGSTOP) as standby
	// and b is killed: nothing answers DNS, and still the open connection
	// carries lines, new connections to api.e2e.test (its element from
	// before both kills, never refreshed) and to the CIDR land, and the
	// denied address stays closed. Then a thaws and takes over.
	e.start("a")
	e.waitRole("a", ha.RoleStandby, 60*time.Second)
	frozen := e.procs["a"].Process
	if err := frozen.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("freeze a: %v", err)
	}
	thawed := false
	defer func() {
		if !thawed {
			_ = frozen.Signal(syscall.SIGCONT)
		}
	}()
	keepLines := func() int {
		n := 0
		for _, l := range s.Host.Lines() {
			if l.Local.Addr() == s.Host.Addr4 && strings.HasPrefix(l.Text, "keep") {
				n++
			}
		}
		return n
	}
	gapWatch, stopGapWatch := context.WithCancel(cx)
	defer stopGapWatch()
	probe2 := probeProxy(gapWatch, probe.addr)
	apiAtKill2, addrAtKill2, evilAtKill2, linesAtKill2 := hostHits(s.Host, s.API), hostHits(s.Host, s.Host.Addr4), hostHits(s.Host, s.Evil), keepLines()
	tKill2 := time.Now()
	e.kill9("b")
	probe2.dead(tKill2, time.Now())
	waitFor(t, 3*time.Minute, "new connections to api.e2e.test and the CIDR and lines on the open connection with no ctld running", func() bool {
		return hostHits(s.Host, s.API) >= apiAtKill2+2 && hostHits(s.Host, s.Host.Addr4) >= addrAtKill2+2 && keepLines() >= linesAtKill2+3
	}, func() string {
		// No ctld answers: what the host saw is all there is.
		return fmt.Sprintf("api %d, cidr %d hits, %d lines (at the kill %d, %d, %d)",
			hostHits(s.Host, s.API), hostHits(s.Host, s.Host.Addr4), keepLines(), apiAtKill2, addrAtKill2, linesAtKill2)
	})
	gap := time.Since(tKill2)
	if first, n := probe2.answered(); n > 0 {
		t.Errorf("with both instances down something answered on %v %v after the kill: the window had a DNS proxy", probe.addr, first.Sub(tKill2))
	}
	if n := hostHits(s.Host, s.Evil) - evilAtKill2; n > 0 {
		t.Errorf("with no ctld running the denied %v accepted %d connections", s.Evil, n)
	}
	if d := nftDiff(before, nftObjects(t, e.nftTable)); d != "" {
		t.Errorf("with no ctld running the table differs from before:\n%s", d)
	}
	apiInGap2, addrInGap2, linesInGap2 := hostHits(s.Host, s.API)-apiAtKill2, hostHits(s.Host, s.Host.Addr4)-addrAtKill2, keepLines()-linesAtKill2
	tCont := time.Now()
	if err := frozen.Signal(syscall.SIGCONT); err != nil {
		t.Fatalf("thaw a: %v", err)
	}
	thawed = true
	na2 := e.waitPrimary("a", 60*time.Second)
	failover2 := time.Since(tCont)
	first2, _ := probe2.answered()
	stopGapWatch()
	switch {
	case first2.IsZero():
		t.Errorf("the proxy never answered after a thawed")
	case first2.Sub(tCont) > failover2:
		t.Errorf("a's proxy answered %v after it thawed, later than its takeover (%v)", first2.Sub(tCont).Round(time.Millisecond), failover2.Round(time.Millisecond))
	}
	if na2.Epoch <= nb.Epoch {
		t.Fatalf("epoch after the second failover %d, want > %d", na2.Epoch, nb.Epoch)
	}
	if r := e.lookup(cx, "fo", "z.cdn.e2e.test")["z.cdn.e2e.test"]; !slices.Equal(r.Addrs, []netip.Addr{s.CDN}) {
		t.Errorf("nslookup after the second takeover = %v, want %v:\n%s", r.Addrs, s.CDN, r.Out)
	}
	if d := nftDiff(before, nftObjects(t, e.nftTable)); d != "" {
		t.Errorf("after the second takeover the table differs from before:\n%s", d)
	}
	if n := askedCount(s.DNS, "api.e2e.test"); n != apiAsked {
		t.Errorf("the upstream got %d queries for api.e2e.test since the traffic started, want none", n-apiAsked)
	}
	t.Logf("no ctld for %v (b killed, a frozen): new connections to api.e2e.test (element from before the kills) %d, to the CIDR %d, lines on the open connection %d, none to the denied address, no DNS answer; a thawed: primary after %v, its proxy answering after %v",
		gap.Round(time.Millisecond), apiInGap2, addrInGap2, linesInGap2, failover2.Round(time.Millisecond), first2.Sub(tCont).Round(time.Millisecond))

	e.guestExec(cx, "fo", "touch /tmp/stop")
	rel, err := c.Release(cx, "fo", api.ReleaseRequest{OperationID: "release-fo", Generation: 1})
	if err != nil {
		t.Fatalf("release: %v", err)
	}
	if !rel.Proof.Clean || rel.Proof.Epoch != na2.Epoch {
		t.Errorf("release after the failover: %+v", rel.Proof)
	}
}

// askedCount is how many queries for name the server got.
func askedCount(s *testDNS, name string) int {
	n := 0
	for _, q := range s.Queries() {
		if q.Name == dns.CanonicalName(name) {
			n++
		}
	}
	return n
}

// proxyProbe asks the DNS proxy's port a question every 20 ms from the
// node and remembers when the first query sent after a moment (dead) got
// an answer, any answer.
type proxyProbe struct {
	addr netip.AddrPort

	mu           sync.Mutex
	kill, diedAt time.Time
	first        time.Time
	n, answers   int
}

func probeProxy(ctx context.Context, addr netip.AddrPort) *proxyProbe {
	p := &proxyProbe{addr: addr}
	go func() {
		cl := &dns.Client{Net: "udp", Timeout: 200 * time.Millisecond}
		m := new(dns.Msg)
		m.SetQuestion("probe.e2e.test.", dns.TypeA)
		for ctx.Err() == nil {
			sent := time.Now()
			_, _, err := cl.Exchange(m, addr.String())
			got := time.Now()
			p.mu.Lock()
			if !p.diedAt.IsZero() && sent.After(p.diedAt) {
				p.n++
				if err == nil {
					p.answers++
					if p.first.IsZero() {
						p.first = got
					}
				}
			}
			p.mu.Unlock()
			time.Sleep(time.Until(sent.Add(20 * time.Millisecond)))
		}
	}()
	return p
}

// dead says the old primary was killed at kill and is gone as of diedAt
// (answers to queries sent before then do not count).
func (p *proxyProbe) dead(kill, diedAt time.Time) {
	p.mu.Lock()
	p.kill, p.diedAt = kill, diedAt
	p.mu.Unlock()
}

// back is the time from the kill to the first answer, 0 if none,
// and the number of probes sent after the death.
func (p *proxyProbe) back() (time.Duration, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.first.IsZero() {
		return 0, p.n
	}
	return p.first.Sub(p.kill), p.n
}

// answered is the first answer to a query sent after the death (zero if
// none) and how many were answered so far.
func (p *proxyProbe) answered() (time.Time, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.first, p.answers
}
