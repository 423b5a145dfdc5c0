package apiserver

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
)

// fakeUsage is a stream of n records numbered from 1.
type fakeUsage struct {
	n     uint64
	calls int
	acks  []uint64
}

func (f *fakeUsage) Usage(ctx context.Context, q api.UsageQuery) (api.UsagePage, error) {
	after, limit := q.After, q.Limit
	f.calls++
	if q.Ack {
		f.acks = append(f.acks, after)
	}
	p := api.UsagePage{Records: []api.UsageRecord{}, Next: after, First: 1, Last: f.n}
	for s := after + 1; s <= f.n && len(p.Records) < limit; s++ {
		p.Records = append(p.Records, api.UsageRecord{Seq: s, SandboxID: "sb", Generation: 1, Start: time.Unix(int64(s), 0).UTC(), End: time.Unix(int64(s)+1, 0).UTC(),
			Usage: api.Usage{CPUUsec: s}})
		p.Next = s
	}
	return p, nil
}

// TestUsageRoute: GET /v1/usage pages over a real socket with the real
// client; a bad cursor or limit is refused before the service sees it.
func TestUsageRoute(t *testing.T) {
	fu := &fakeUsage{n: 5}
	srv := startServer(t, &Server{Service: &fakeService{}, AllowedGID: -1, Usage: fu})
	c := &api.Client{SocketPath: srv.sock}
	ctx := context.Background()
	var seen []uint64
	for after := uint64(0); ; {
		p, err := c.UsageAck(ctx, after, 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Records) == 0 {
			break
		}
		for _, r := range p.Records {
			seen = append(seen, r.Usage.CPUUsec)
		}
		after = p.Next
	}
	if len(seen) != 5 || seen[0] != 1 || seen[4] != 5 {
		t.Fatalf("paged %v, want 1..5", seen)
	}
	// UsageAck acknowledges each cursor it reads after.
	if len(fu.acks) != 4 || fu.acks[0] != 0 || fu.acks[3] != 5 {
		t.Fatalf("acknowledged %v, want 0 2 4 5", fu.acks)
	}
	// A plain read acknowledges nothing.
	if _, err := c.Usage(ctx, 3, 2); err != nil || len(fu.acks) != 4 {
		t.Fatalf("a plain read: %v, acks %v", err, fu.acks)
	}
	calls := fu.calls
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", srv.sock)
	}}}
	for _, q := range []string{"after=-1", "after=x", "limit=0", "limit=1001", "limit=1e3", "after=99999999999999999999999", "ack=maybe"} {
		resp, err := hc.Get("http://ctld/v1/usage?" + q)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), string(errdefs.CodeInvalidArgument)) {
			t.Errorf("%s: %d %s, want 400 invalid_argument", q, resp.StatusCode, b)
		}
	}
	if fu.calls != calls {
		t.Fatalf("the service saw %d bad requests", fu.calls-calls)
	}
	// A server without metering says so.
	bare := startServer(t, &Server{Service: &fakeService{}, AllowedGID: -1})
	if _, err := (&api.Client{SocketPath: bare.sock}).Usage(ctx, 0, 1); errdefs.CodeOf(err) != errdefs.CodeUnavailable {
		t.Fatalf("no metering: %v, want unavailable", err)
	}
}
