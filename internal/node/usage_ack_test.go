package node

import (
	"context"
	"testing"

	"github.com/ctld/ctld/internal/errdefs"
)

// TestUsageAck: a read with ack drops the records up to its cursor (the
// reader stored them), a read without drops nothing, and a node whose
// term ended takes no acknowledgement (a journal write).
func TestUsageAck(t *testing.T) {
	ctx := context.Background()
	tk, _ := fakeKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	r.mustClaim(sb, claimReq("c1", 1))
	writeFakeCgroup(t, tk.leases.Dir(r.sandbox(sb).LeaseID), 1000, 1<<20)
	for range 3 {
		if err := r.n.meter.Tick(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if p, err := r.n.Usage(ctx, 2, 100, false); err != nil || len(p.Records) != 1 || p.First != 1 {
		t.Fatalf("read after 2 without ack: %+v, %v", p, err)
	}
	if p, err := r.n.Usage(ctx, 2, 100, true); err != nil || len(p.Records) != 1 || p.Records[0].Seq != 3 || p.First != 3 || p.Acked != 2 {
		t.Fatalf("read after 2 with ack: %+v, %v; want record 3, first 3", p, err)
	}
	if p, _ := r.n.Usage(ctx, 0, 100, false); len(p.Records) != 1 || p.First != 3 {
		t.Fatalf("after the ack: %+v; want only record 3 kept", p)
	}
	r.end() // the term ends
	if _, err := r.n.Usage(ctx, 3, 100, true); errdefs.CodeOf(err) != errdefs.CodeNotPrimary {
		t.Fatalf("ack after the term: %v, want not_primary", err)
	}
}
