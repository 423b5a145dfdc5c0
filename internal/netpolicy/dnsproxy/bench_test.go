package dnsproxy

import (
	"net"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// BenchmarkQuery: queries/s of an allowed name (A, two addresses, a
// recording Allower that returns at once) through the proxy, and the
// same queries straight to the fake upstream; the ratio is the proxy's
// cost. UDP, 8 clients per CPU, each on its own socket bound to slot 1's
// sandbox address.
func BenchmarkQuery(b *testing.B) {
	// The proxy's cost, not its per-sandbox rate limit: all clients
	// share slot 1's address.
	h := start(b, func(c *Config) { c.QueryRate, c.QueryBurst = 1e9, 1e9 })
	for _, c := range []struct{ name, addr string }{{"direct", h.up.addr}, {"proxy", h.addr}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				cl := dns.Client{Net: "udp", Timeout: 5 * time.Second, Dialer: &net.Dialer{LocalAddr: &net.UDPAddr{IP: net.ParseIP(src1)}}}
				conn, err := cl.Dial(c.addr)
				if err != nil {
					b.Error(err)
					return
				}
				defer conn.Close()
				m := new(dns.Msg)
				m.SetQuestion("www.example.com.", dns.TypeA)
				m.SetEdns0(EDNSSize, false)
				for pb.Next() {
					m.Id = dns.Id()
					r, _, err := cl.ExchangeWithConn(m, conn)
					if err != nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) != 2 {
						b.Errorf("%s: %v %v", c.name, err, r)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "queries/s")
		})
		h.allow.take() // keep the recorder small
	}
}
