package node

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ctld/ctld/internal/journal"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// TestBootCPUAllowance: a claim that asks for less CPU than the node's boot
// allowance boots at the allowance (runsc's boot is not the workload's: a
// boot throttled to a small share took minutes and missed its readiness
// bound), and its lease is back at the claim's share before the generation
// is published ready. The OCI spec carries the claim's CPU limit: runsc
// leaves the lease it did not create alone (lease's
// TestKernelRunscPrecreatedLease), so the spec cannot end the allowance.
func TestBootCPUAllowance(t *testing.T) {
	for _, tc := range []struct {
		name        string
		claim, boot int64
		lowered     bool
	}{
		{"small claim boots at the allowance", 100, 1000, true},
		{"claim above the allowance keeps its own", 2000, 1000, false},
		{"no allowance", 100, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tk, fk := fakeKernel(t)
			tk.bootCPU = tc.boot
			tk.resources = &journal.Resources{CPUMillis: tc.claim, MemoryBytes: 128 << 20, PIDs: 128, DiskBytes: 16 << 20}
			r := newRig(t, tk)
			r.mustBoot()
			resp := r.mustClaim(sb, claimReq("op1", 1))
			cid := resp.Sandbox.ContainerID
			want := []int64{tc.claim}
			if tc.lowered {
				want = []int64{tc.boot, tc.claim}
			}
			if got := fk.Leases().CPUMaxHistory(cid); !slices.Equal(got, want) {
				t.Fatalf("cpu.max of the lease over the claim: %v, want %v", got, want)
			}
			calls := fk.Calls()
			start := slices.Index(calls, "runsc start "+cid)
			lower := slices.Index(calls, fmt.Sprintf("lease cpu.max %s %dm", cid, tc.claim))
			if tc.lowered && (start < 0 || lower < start) {
				t.Fatalf("the allowance ended at call %d, runsc start was call %d: %v", lower, start, calls)
			}
			if st := r.sandbox(sb); st.State != "ready" {
				t.Fatalf("state %s, want ready", st.State)
			}
			b, err := os.ReadFile(filepath.Join(r.n.bundleDir(cid), "config.json"))
			if err != nil {
				t.Fatal(err)
			}
			var spec specs.Spec
			if err := json.Unmarshal(b, &spec); err != nil {
				t.Fatal(err)
			}
			cpu := spec.Linux.Resources.CPU
			if cpu == nil || cpu.Quota == nil || *cpu.Quota != tc.claim*100 {
				t.Fatalf("OCI spec CPU %+v, want the claim's quota %d", cpu, tc.claim*100)
			}
			r.mustRelease(sb, "op2", 1)
			r.checkClean("after release")
		})
	}
}
