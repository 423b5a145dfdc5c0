package node

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
)

// TestUpdateNetworkNotBuiltYet: until the sandbox network is wired the node
// refuses a live update of a ready generation (fail closed) and changes
// nothing: no kernel call, the same record. The node's network work
// replaces this test with the real one.
func TestUpdateNetworkNotBuiltYet(t *testing.T) {
	tk, k := fakeKernel(t)
	r := newRig(t, tk)
	r.mustBoot()
	r.mustClaim(sb, claimReq("c1", 1))
	before := r.sandbox(sb)
	k.Calls()
	_, err := r.n.UpdateNetwork(context.Background(), sb, api.NetworkPolicy{Mode: api.NetworkOpen})
	if !errdefs.Is(err, errdefs.CodeConflict) || !strings.Contains(err.Error(), "live network update is not built yet") {
		t.Fatalf("UpdateNetwork = %v, want conflict: not built yet", err)
	}
	if calls := k.Calls(); len(calls) != 0 {
		t.Errorf("a refused update called the kernel: %q", calls)
	}
	if after := r.sandbox(sb); !reflect.DeepEqual(after, before) {
		t.Errorf("a refused update changed the record:\n%+v\n%+v", before, after)
	}
}
