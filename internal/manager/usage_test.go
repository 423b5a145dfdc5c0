package manager

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
)

// fakeStream is a node's metering stream of n records that fails the
// reads listed in fail (by call number).
type fakeStream struct {
	n, first uint64
	calls    int
	fail     map[int]bool
	acked    uint64 // the highest cursor acknowledged
}

func (f *fakeStream) Node(ctx context.Context) (api.Node, error) {
	return api.Node{NodeID: "node-1"}, nil
}

func (f *fakeStream) UsageAck(ctx context.Context, after uint64, limit int) (api.UsagePage, error) {
	f.calls++
	if f.fail[f.calls] {
		return api.UsagePage{}, errors.New("connection reset")
	}
	f.acked = max(f.acked, after)
	p := api.UsagePage{Next: after, First: f.first, Last: f.n}
	for s := max(after+1, f.first); s <= f.n && len(p.Records) < limit; s++ {
		p.Records = append(p.Records, api.UsageRecord{Seq: s, SandboxID: "sb", Generation: 1, End: time.Unix(int64(s), 0), Usage: api.Usage{CPUUsec: 1}})
		p.Next = s
	}
	return p, nil
}

// TestPullerResumes: a pull cut off between pages resumes at the stored
// cursor: every record is stored once.
func TestPullerResumes(t *testing.T) {
	ctx := context.Background()
	s, err := OpenStore(ctx, filepath.Join(t.TempDir(), "m.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	src := &fakeStream{n: 23, first: 1, fail: map[int]bool{3: true}}
	p := UsagePuller{Store: s, Source: src, Page: 5}
	n, err := p.PullOnce(ctx)
	if err == nil || n != 10 {
		t.Fatalf("first pull = %d, %v; want 10 and the error", n, err)
	}
	// It acknowledged what it stored, no more.
	if cur, _ := s.UsageCursor(ctx, "node-1"); src.acked != 5 || cur != 10 {
		t.Fatalf("acknowledged %d with 10 stored; want 5 (the cursor of its last successful read)", src.acked)
	}
	if n, err = p.PullOnce(ctx); err != nil || n != 13 {
		t.Fatalf("second pull = %d, %v; want 13", n, err)
	}
	if n, err = p.PullOnce(ctx); err != nil || n != 0 {
		t.Fatalf("third pull = %d, %v; want 0", n, err)
	}
	if src.acked != 23 {
		t.Fatalf("acknowledged %d after storing all 23", src.acked)
	}
	sums, err := s.SumUsage(ctx, UsageQuery{}, true)
	if err != nil || len(sums) != 1 || sums[0].Records != 23 || sums[0].Usage.CPUUsec != 23 {
		t.Fatalf("sums = %+v, %v", sums, err)
	}
	// The node's retention dropped 24..30 before they were pulled: the
	// puller logs the gap and goes on from what is kept.
	src.n, src.first = 40, 31
	if n, err = p.PullOnce(ctx); err != nil || n != 10 {
		t.Fatalf("pull after the gap = %d, %v", n, err)
	}
	if c, _ := s.UsageCursor(ctx, "node-1"); c != 40 {
		t.Fatalf("cursor %d, want 40", c)
	}
}
