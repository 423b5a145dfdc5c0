package node

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/guest"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// TestRuntimePIDsAllowance: a lease's pids.max is the claim's PIDs (the
// workload's) plus the node's allowance for the runtime's own threads,
// and the ledger counts both, so capacity stays honest: a claim whose
// PIDs fit only without the allowance is refused, and a release returns
// all of it. The record keeps the allowance it was given.
func TestRuntimePIDsAllowance(t *testing.T) {
	if s := guest.LeaseSpec("c", journal.Resources{CPUMillis: 100, MemoryBytes: 64 << 20, PIDs: 32}, 0, 64); s.PIDs != 96 {
		t.Fatalf("lease pids.max %d, want 96 (32 and the runtime's 64)", s.PIDs)
	}
	tk, _ := fakeKernel(t)
	tk.runtimePIDs = 64
	r := newRig(t, tk)
	r.mustBoot()
	req := claimReq("op1", 1)
	req.Resources.PIDs = 32
	resp := r.mustClaim(sb, req)
	b, err := os.ReadFile(filepath.Join(r.n.bundleDir(resp.Sandbox.ContainerID), "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	if p := spec.Linux.Resources.Pids; p == nil || p.Limit == nil || *p.Limit != 96 {
		t.Fatalf("OCI spec pids %+v, want 96 (32 and the runtime's 64)", p)
	}
	if got := r.sandbox(sb); got.RuntimePIDs != 64 || got.Resources.PIDs != 32 {
		t.Fatalf("record: runtime PIDs %d, PIDs %d; want 64 and 32", got.RuntimePIDs, got.Resources.PIDs)
	}
	if resp.Sandbox.Resources.PIDs != 32 {
		t.Fatalf("the API shows PIDs %d, want the claim's 32", resp.Sandbox.Resources.PIDs)
	}
	nd, err := r.n.Node(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if nd.Capacity.Leased.PIDs != 96 {
		t.Fatalf("leased PIDs %d, want 96", nd.Capacity.Leased.PIDs)
	}
	// What is left fits the claim's PIDs alone, not with the allowance.
	free := nd.Capacity.Allocatable.PIDs - nd.Capacity.Leased.PIDs
	big := claimReq("op2", 1)
	big.Resources.PIDs = free
	if _, err, _ := r.claim("other", big); errdefs.CodeOf(err) != errdefs.CodeCapacityExhausted || !strings.Contains(err.Error(), "pids") {
		t.Fatalf("claim of the %d free PIDs without room for the runtime's: %v; want capacity_exhausted on pids", free, err)
	}
	big = claimReq("op3", 1)
	big.Resources.PIDs = free - 64
	r.mustClaim("other", big)
	r.mustRelease(sb, "op4", 1)
	r.mustRelease("other", "op5", 1)
	if nd, _ := r.n.Node(t.Context()); nd.Capacity.Leased != (Capacity{}) {
		t.Fatalf("leased after the releases: %+v", nd.Capacity.Leased)
	}
	r.checkClean("after release")
}
