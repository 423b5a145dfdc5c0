package dnsproxy

import (
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestObserve: every handled query is told to Observe once, with the
// rcode of its answer, and a query dropped over the in-flight bound as
// dropped.
func TestObserve(t *testing.T) {
	var mu sync.Mutex
	var got []string
	h := start(t, func(c *Config) {
		c.MaxPerSandbox = 1
		c.QueryTimeout = 3 * time.Second
		c.Observe = func(rcode int, dropped bool) {
			mu.Lock()
			defer mu.Unlock()
			if dropped {
				got = append(got, "dropped")
				return
			}
			got = append(got, dns.RcodeToString[rcode])
		}
	})
	h.query(t, "udp", src1, "www.example.com.", dns.TypeA)
	h.query(t, "udp", src1, "evil.com.", dns.TypeA)
	h.query(t, "udp", src1, "nx.example.com.", dns.TypeA)
	hold, first, c, m := h.holdOne(t, src1)
	if r, _, err := c.Exchange(m, h.addr); err == nil {
		t.Errorf("a query over the sandbox's in-flight bound was answered: %s", show(r))
	}
	close(hold)
	if err := <-first; err != nil {
		t.Fatalf("the held query: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	checkList(t, "observed", got, []string{"NOERROR", "REFUSED", "NXDOMAIN", "dropped", "NOERROR"})
}
