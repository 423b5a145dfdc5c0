package netbench

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	vnl "github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/netpolicy"
)

// The benchmarks measure with their own loops and print ratios against a
// baseline measured in the same run (vmrun runs them with -benchtime 1x:
// one b.N, one run). Sizes can be changed through the environment.

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[max(0, min(i, len(s))-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// calibrate times a fixed CPU-bound loop (no syscalls) 5 times and returns
// the median: how fast the VM runs at that moment, printed beside each
// phase of a benchmark so a phase measured while the host was busy shows.
func calibrate() time.Duration {
	var ds []time.Duration
	x := uint64(1)
	for range 5 {
		t := time.Now()
		for range 5_000_000 {
			x = x*6364136223846793005 + 1442695040888963407
		}
		ds = append(ds, time.Since(t))
	}
	if x == 0 { // keeps the loop from being optimized away
		panic("calibrate")
	}
	return pct(ds, 50)
}

// Ports of the packet-path servers on the test host.
const (
	sinkPort = 9000 // reads to EOF, answers the byte count (8 bytes)
	rate     = 9001 // reads one byte, answers it, closes
)

// startPathServers runs the sink and the connection-rate server in the
// test host's netns until the test ends.
func startPathServers(b *testing.B, h *ktest.TestHost) {
	serve := func(port uint16, handle func(net.Conn)) {
		// A WaitGroup per listener: cleanups run one by one, so a
		// shared one would wait for a listener not yet closed.
		var wg sync.WaitGroup
		var ln net.Listener
		if err := h.Netns.Do(func() (err error) {
			ln, err = net.Listen("tcp", netip.AddrPortFrom(h.Addr4, port).String())
			return err
		}); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { ln.Close(); wg.Wait() })
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer c.Close()
					_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
					handle(c)
				}()
			}
		}()
	}
	serve(sinkPort, func(c net.Conn) {
		n, err := io.Copy(io.Discard, c)
		if err != nil {
			return
		}
		_ = binary.Write(c, binary.BigEndian, uint64(n))
	})
	serve(rate, func(c net.Conn) {
		var one [1]byte
		if _, err := io.ReadFull(c, one[:]); err == nil {
			_, _ = c.Write(one[:])
		}
	})
}

// bulk copies size bytes to the sink from ns and returns the throughput
// in MB/s (from the dial to the sink's count).
func bulk(ns ktest.Netns, dst netip.Addr, size int) (float64, error) {
	buf := make([]byte, 64<<10)
	t0 := time.Now()
	c, err := dialFrom(ns, netip.AddrPortFrom(dst, sinkPort), 5*time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
	for sent := 0; sent < size; sent += len(buf) {
		if _, err := c.Write(buf); err != nil {
			return 0, err
		}
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return 0, err
	}
	var got uint64
	if err := binary.Read(c, binary.BigEndian, &got); err != nil {
		return 0, fmt.Errorf("read the sink's count: %w", err)
	}
	if got != uint64((size+len(buf)-1)/len(buf)*len(buf)) {
		return 0, fmt.Errorf("the sink got %d bytes", got)
	}
	return float64(got) / 1e6 / time.Since(t0).Seconds(), nil
}

// connRate runs n connect + 1 byte each way + close from ns and returns
// connections per second.
func connRate(ns ktest.Netns, dst netip.Addr, n int) (float64, error) {
	t0 := time.Now()
	err := ns.Do(func() error {
		d := net.Dialer{Timeout: 5 * time.Second}
		var one [1]byte
		for i := range n {
			c, err := d.Dial("tcp", netip.AddrPortFrom(dst, rate).String())
			if err != nil {
				return fmt.Errorf("connection %d: %w", i, err)
			}
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			_, err = c.Write([]byte{'x'})
			if err == nil {
				_, err = io.ReadFull(c, one[:])
			}
			c.Close()
			if err != nil {
				return fmt.Errorf("connection %d: %w", i, err)
			}
		}
		return nil
	})
	return float64(n) / time.Since(t0).Seconds(), err
}

type netPath struct {
	name string
	ns   ktest.Netns
	// before readies the node for the path.
	before func()
}

func median(xs []float64) float64 { return quantile(xs, 2, 4) }

// quantile is the k/n quantile of xs (nearest rank).
func quantile(xs []float64, k, n int) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*k/n)]
}

// BenchmarkPacketPath: TCP throughput (a bulk copy of
// CTLD_BENCH_BULK_MB, default 4 MB) and connection rate
// (CTLD_BENCH_CONNS, default 40 connects + 1 byte + close) from a client
// netns to a test host, through a generation's Links and Firewall (a
// restricted policy allowing the test host's ports; the table also
// masquerades the pool) versus through a bare veth pair with plain
// forwarding and no ctld table, and versus the same bare veth with only
// the node's masquerade (a table of its own with one masquerade rule:
// conntrack and NAT, no policy), which every node pays whatever the
// policy. The guest is single-threaded TCG on a host it shares with other
// VMs, whose load swings by several times within seconds, so the
// measurements are short and paired: each of CTLD_BENCH_ROUNDS (default
// 16) rounds measures the three paths back to back, in an order that
// rotates and reverses from round to round (the tables are deleted and
// made again between them). Printed: the medians and their ratio
// policy/bare, and the median and quartiles of the rounds' own ratios
// policy/bare (goal >= 0.9), policy/masquerade (the policy's own cost)
// and masquerade/bare.
func BenchmarkPacketPath(b *testing.B) {
	r := newRig(b, true)
	sizeMB := envInt("CTLD_BENCH_BULK_MB", 4)
	conns := envInt("CTLD_BENCH_CONNS", 40)
	rounds := envInt("CTLD_BENCH_ROUNDS", 16)
	startPathServers(b, r.host)
	dst := r.host.Addr4

	// The policy path: a generation's whole network.
	p := r.policy("9000", "9001")
	g := r.alloc("nbpath")
	b.Cleanup(func() {
		if err := r.remove(g); err != nil {
			b.Error(err)
		}
	})
	r.make(g, p)
	// The bare path: a veth pair with addresses and a route, nothing else.
	bare := ktest.NewNetns(b)
	ktest.VethPair(b, ktest.Veth{Netns: netns.None(), Name: "nbbare0", Addr: "10.241.0.0/31"}, ktest.Veth{Netns: bare.Handle, Name: "eth0", Addr: "10.241.0.1/31"})
	h, err := vnl.NewHandleAt(bare.Handle)
	if err != nil {
		b.Fatal(err)
	}
	eth0, err := h.LinkByName("eth0")
	if err == nil {
		err = h.RouteAdd(&vnl.Route{LinkIndex: eth0.Attrs().Index, Gw: net.ParseIP("10.241.0.0")})
	}
	h.Close()
	if err != nil {
		b.Fatalf("bare client's route: %v", err)
	}

	masq := &nftables.Table{Name: "nbmasq", Family: nftables.TableFamilyINet}
	b.Cleanup(func() { r.dropTable(masq) })
	paths := []netPath{
		{"bare", bare, func() { r.deleteTable(); r.dropTable(masq) }},
		{"masq", bare, func() { r.deleteTable(); r.masquerade(masq, netip.MustParseAddr("10.241.0.1")) }},
		{"policy", g.netns(), func() {
			r.dropTable(masq)
			if err := r.fw.Ensure(r.ctx); err != nil {
				b.Fatal(err)
			}
			if err := r.fw.Apply(r.ctx, g.owner, r.effective(g, p)); err != nil {
				b.Fatal(err)
			}
		}},
	}
	mbps := map[string][]float64{}
	cps := map[string][]float64{}
	b.ResetTimer()
	for round := range rounds {
		order := []netPath{paths[round%3], paths[(round+1)%3], paths[(round+2)%3]}
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, pa := range order {
			pa.before()
			// Warm up (neighbours, routes) outside the measurement.
			if _, err := connRate(pa.ns, dst, 3); err != nil {
				b.Fatalf("%s warm-up: %v", pa.name, err)
			}
			m, err := bulk(pa.ns, dst, sizeMB<<20)
			if err != nil {
				b.Fatalf("%s bulk: %v", pa.name, err)
			}
			c, err := connRate(pa.ns, dst, conns)
			if err != nil {
				b.Fatalf("%s connections: %v", pa.name, err)
			}
			mbps[pa.name] = append(mbps[pa.name], m)
			cps[pa.name] = append(cps[pa.name], c)
			b.Logf("round %d %-6s throughput %7.1f MB/s  connection rate %7.1f conn/s", round, pa.name, m, c)
		}
	}
	b.StopTimer()
	// Prove the policy path was the filtered one: with the policy
	// applied (odd rounds end bare, with no table) a port it does not
	// name is closed.
	paths[2].before()
	if c, err := r.dialTCP(g, 8081, 500*time.Millisecond); err == nil {
		c.Close()
		b.Fatal("the policy client reached port 8081: the firewall was not in the path")
	}
	// paired: the quartiles of the rounds' ratios a/z.
	paired := func(m map[string][]float64, a, z string) (q1, q2, q3 float64) {
		var rs []float64
		for i := range m[z] {
			rs = append(rs, m[a][i]/m[z][i])
		}
		return quantile(rs, 1, 4), quantile(rs, 2, 4), quantile(rs, 3, 4)
	}
	tp, tb := median(mbps["policy"]), median(mbps["bare"])
	cp, cb := median(cps["policy"]), median(cps["bare"])
	t1, t2, t3 := paired(mbps, "policy", "bare")
	c1, c2, c3 := paired(cps, "policy", "bare")
	for _, x := range []struct{ a, z, what string }{
		{"policy", "masq", "policy/masquerade (the policy's own cost)"},
		{"masq", "bare", "masquerade/bare (conntrack and NAT)"},
	} {
		m1, m2, m3 := paired(mbps, x.a, x.z)
		n1, n2, n3 := paired(cps, x.a, x.z)
		b.Logf("packet path, %d rounds, %s: rounds' ratios median throughput %.3f (quartiles %.3f..%.3f), connection rate %.3f (%.3f..%.3f)",
			rounds, x.what, m2, m1, m3, n2, n1, n3)
		if x.a == "policy" {
			b.ReportMetric(m2, "throughput-vs-masq-paired-ratio")
			b.ReportMetric(n2, "connrate-vs-masq-paired-ratio")
		}
	}
	b.Logf("packet path, %d rounds: throughput (%d MB copy) median bare %.1f MB/s, policy %.1f MB/s: ratio %.3f; rounds' ratios median %.3f (quartiles %.3f..%.3f) (goal >= 0.9)",
		rounds, sizeMB, tb, tp, tp/tb, t2, t1, t3)
	b.Logf("packet path, %d rounds: connection rate (%d connects) median bare %.1f/s, policy %.1f/s: ratio %.3f; rounds' ratios median %.3f (quartiles %.3f..%.3f) (goal >= 0.9)",
		rounds, conns, cb, cp, cp/cb, c2, c1, c3)
	b.ReportMetric(t2, "throughput-paired-ratio")
	b.ReportMetric(c2, "connrate-paired-ratio")
	b.ReportMetric(tp/tb, "throughput-ratio")
	b.ReportMetric(cp/cb, "connrate-ratio")
}

// BenchmarkNetworkScale: the network step and the live update on a node
// with 1 live generation and on a node with CTLD_BENCH_LIVE (default 500)
// live generations (each a netns, links, a restricted policy and an open
// TCP connection, so the conntrack table holds their flows):
//   - the network step: Links.Make + Firewall.Apply of a new generation
//     (its netns made before the clock starts), CTLD_BENCH_SAMPLES
//     (default 50) times, each removed afterwards; each part is also
//     timed on its own;
//   - the live update of one generation: Firewall.Apply (replace) +
//     Flows.Cut, alternating a policy that cuts one open flow and one
//     that cuts none, as many times.
//
// The two nodes are two network namespaces of one kernel, each with its
// own uplink and test host, links, nft table and conntrack table: node A
// is the VM's root netns, node B a netns of the benchmark's. Their samples
// alternate (A, B, B, A, ...), so a change of the VM's speed (a TCG guest
// on a shared host: a fixed CPU loop moved by up to 1.6x between phases a
// minute apart) falls on both alike; the ratio B/A is the cost of the
// live generations. What is global to the kernel (the number of netns,
// the conntrack hash) is in both. Every sample runs on a thread locked
// into its node's netns (inNode), node A's too: a locked goroutine that
// blocks in the poller (google/nftables' netlink) wakes through a thread
// handoff, a cost both nodes must pay alike. The step is also timed on node A
// before node B is grown (sequential), as earlier versions measured it.
func BenchmarkNetworkScale(b *testing.B) {
	live := envInt("CTLD_BENCH_LIVE", 500)
	samples := envInt("CTLD_BENCH_SAMPLES", 50)
	one := newRig(b, true)
	rootNS, err := netns.Get()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = rootNS.Close() })
	nodeA := ktest.Netns{Path: "the VM's root netns", Handle: rootNS}
	nodeB := ktest.NewNetns(b)
	var many *rig
	inNode(b, nodeB, func() {
		many = newRig(b, true)
		// The rig's own cleanups run outside node B: its table, links
		// and conntrack go with node B's netns; its generations are
		// removed below, in node B.
		many.ct.NetNS = int(nodeB.Handle)
	})
	// Each node's policies name its own test host; its generations'
	// names (and so their netns names) are its own.
	nodes := []struct {
		r            *rig
		in           func(func())
		name, id     string
		wide, narrow netpolicy.Policy
	}{
		{one, func(fn func()) { inNode(b, nodeA, fn) }, "node A", "nba", one.policy("8080", "8081"), one.policy("8080")},
		{many, func(fn func()) { inNode(b, nodeB, fn) }, "node B", "nbb", many.policy("8080", "8081"), many.policy("8080")},
	}

	type liveSet struct {
		bg   []*gen
		open []net.Conn
	}
	lives := make([]liveSet, 2)
	b.Cleanup(func() {
		for k, nd := range nodes {
			for _, c := range lives[k].open {
				c.Close()
			}
			nd.in(func() {
				// Delete the table at once: removing 500 generations
				// one by one lists the table each time (the churn test
				// proves Remove).
				nd.r.deleteTable()
				for _, g := range lives[k].bg {
					if err := nd.r.remove(g); err != nil {
						b.Error(err)
					}
				}
			})
		}
	})
	grow := func(k, n int) {
		r, ls := nodes[k].r, &lives[k]
		t0 := time.Now()
		for len(ls.bg) < n {
			g := r.alloc(fmt.Sprintf("%sbg%03d", nodes[k].id, len(ls.bg)))
			ls.bg = append(ls.bg, g)
			r.make(g, nodes[k].narrow)
			c, err := r.dialTCP(g, 8080, 5*time.Second)
			if err != nil {
				b.Fatalf("%s %s: %v", nodes[k].name, g.name, err)
			}
			ls.open = append(ls.open, c)
			if err := echoTCP(c, g.name); err != nil {
				b.Fatalf("%s %s: %v", nodes[k].name, g.name, err)
			}
		}
		b.Logf("%s: %d live generations with one open flow each (made in %v)", nodes[k].name, len(ls.bg), time.Since(t0).Round(time.Millisecond))
	}
	// step is one sample of the step and of its two parts.
	step := func(k, i int) (d, mk, ap time.Duration) {
		r := nodes[k].r
		g := r.alloc(fmt.Sprintf("%sstep%03d", nodes[k].id, i))
		r.makeNetns(g)
		t0 := time.Now()
		if err := r.links.Make(r.ctx, g.owner, g.path); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := r.fw.Apply(r.ctx, g.owner, r.effective(g, nodes[k].narrow)); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		if err := r.remove(g); err != nil {
			b.Fatal(err)
		}
		return t2.Sub(t0), t1.Sub(t0), t2.Sub(t1)
	}
	// update switches the node's first generation between wide and
	// narrow; before each switch to narrow it opens a flow to 8081, which
	// that Cut must delete.
	update := func(k, i int) time.Duration {
		r, g := nodes[k].r, lives[k].bg[0]
		pol, wantCut := nodes[k].wide, 0
		var victim net.Conn
		if i%2 == 1 {
			pol, wantCut = nodes[k].narrow, 1
			c, err := r.dialTCP(g, 8081, 5*time.Second)
			if err != nil {
				b.Fatalf("%s: flow to 8081 under the wide policy: %v", nodes[k].name, err)
			}
			victim = c
			if err := echoTCP(c, "victim"); err != nil {
				b.Fatal(err)
			}
		}
		eff := r.effective(g, pol)
		t0 := time.Now()
		if err := r.fw.Apply(r.ctx, g.owner, eff); err != nil {
			b.Fatal(err)
		}
		n, err := r.ct.Cut(r.ctx, g.owner.Block.Slot, eff)
		d := time.Since(t0)
		if err != nil || n != wantCut {
			b.Fatalf("%s update %d: Cut = %d, %v; want %d", nodes[k].name, i, n, err, wantCut)
		}
		if victim != nil {
			// The first cut flows are shown dead (a write gets no echo);
			// every cut is counted by Cut's result above.
			if i < 4 {
				_ = victim.SetDeadline(time.Now().Add(300 * time.Millisecond))
				if _, err := io.WriteString(victim, "after cut\n"); err == nil {
					var one [1]byte
					if _, err := victim.Read(one[:]); err == nil {
						b.Fatalf("%s update %d: the cut flow still echoes", nodes[k].name, i)
					}
				}
			}
			// A reset, not a FIN the kernel would retransmit into the
			// next wide policy as a new flow.
			_ = victim.(*net.TCPConn).SetLinger(0)
			victim.Close()
			if err := echoTCP(lives[k].open[0], "kept"); err != nil {
				b.Fatalf("%s update %d: the kept flow: %v", nodes[k].name, i, err)
			}
		}
		return d
	}

	type result struct{ step, make, apply, update []time.Duration }
	b.ResetTimer()
	grow(0, 1)
	var seq result
	b.Logf("node A alone: calibration (a fixed CPU loop, no syscalls) p50 %.2f ms", ms(calibrate()))
	for i := range samples {
		nodes[0].in(func() {
			d, mk, ap := step(0, i)
			seq.step, seq.make, seq.apply = append(seq.step, d), append(seq.make, mk), append(seq.apply, ap)
		})
	}
	nodes[1].in(func() { grow(1, live) })
	b.Logf("both nodes: calibration p50 %.2f ms", ms(calibrate()))
	res := make([]result, 2)
	for i := range samples {
		for _, k := range []int{i % 2, 1 - i%2} {
			nodes[k].in(func() {
				d, mk, ap := step(k, samples+i)
				x := &res[k]
				x.step, x.make, x.apply = append(x.step, d), append(x.make, mk), append(x.apply, ap)
			})
		}
	}
	for i := range samples {
		for _, k := range []int{i % 2, 1 - i%2} {
			nodes[k].in(func() { res[k].update = append(res[k].update, update(k, i)) })
		}
	}
	b.StopTimer()
	b.Logf("after: calibration p50 %.2f ms", ms(calibrate()))
	for _, x := range []struct {
		what string
		r    result
	}{{"node A alone (1 live, sequential)", seq}, {"node A (1 live, alternating)", res[0]}, {fmt.Sprintf("node B (%d live, alternating)", live), res[1]}} {
		for _, m := range []struct {
			what string
			ds   []time.Duration
		}{{"step (Links.Make + Firewall.Apply)", x.r.step}, {"  of which Links.Make", x.r.make}, {"  of which Firewall.Apply", x.r.apply}, {"update (Apply replace + Cut)", x.r.update}} {
			if len(m.ds) > 0 {
				b.Logf("%-36s %-36s p50 %7.2f ms  p99 %7.2f ms  (n=%d)", x.what+":", m.what, ms(pct(m.ds, 50)), ms(pct(m.ds, 99)), len(m.ds))
			}
		}
	}
	ratio := func(z, a []time.Duration) (float64, float64) {
		return ms(pct(z, 50)) / ms(pct(a, 50)), ms(pct(z, 99)) / ms(pct(a, 99))
	}
	for _, m := range []struct {
		what   string
		a, z   []time.Duration
		metric string
	}{
		{"network step", res[0].step, res[1].step, "step-p50-ratio"},
		{"  Links.Make", res[0].make, res[1].make, ""},
		{"  Firewall.Apply", res[0].apply, res[1].apply, ""},
		{"live update", res[0].update, res[1].update, "update-p50-ratio"},
	} {
		r50, r99 := ratio(m.z, m.a)
		goal := ""
		if m.what == "network step" {
			goal = " (goal <= 1.5)"
		}
		b.Logf("%s: %d live / 1 live, alternating: ratio p50 %.2f, p99 %.2f%s", m.what, live, r50, r99, goal)
		if m.metric != "" {
			b.ReportMetric(r50, m.metric)
		}
	}
	r50, r99 := ratio(res[1].step, seq.step)
	b.Logf("network step: %d live (alternating) / 1 live (sequential, before node B grew): ratio p50 %.2f, p99 %.2f", live, r50, r99)
	b.ReportMetric(r50, "step-seq-p50-ratio")
	b.ReportMetric(ms(pct(res[1].step, 50)), "step-p50-ms")
	b.ReportMetric(ms(pct(res[1].update, 50)), "update-p50-ms")
}

// inNode runs fn on this goroutine's thread switched into node's netns:
// the subsystems open their netlink sockets (and /proc/sys files) in the
// calling thread's netns. A failure inside fn (FailNow) ends the
// goroutine with its thread locked, and the runtime discards the thread.
func inNode(tb testing.TB, node ktest.Netns, fn func()) {
	tb.Helper()
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		tb.Fatalf("get current netns: %v", err)
	}
	defer orig.Close()
	if err := netns.Set(node.Handle); err != nil {
		tb.Fatalf("enter node netns %s: %v", node.Path, err)
	}
	fn()
	if err := netns.Set(orig); err != nil {
		tb.Fatalf("restore netns: %v", err)
	}
	runtime.UnlockOSThread()
}
