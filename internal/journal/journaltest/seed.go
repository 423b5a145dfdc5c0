// Package journaltest fills a journal with history for tests and
// benchmarks: released generations written directly with the journal API,
// shaped like the records a real claim and release leave.
package journaltest

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/proof"
)

// SeedFinished writes n released generations (sandbox record, claim and
// release operations with their stored results, signed-size cleanup proof)
// under sandbox ids prefix0..prefix(n-1), in transactions of 1,000.
func SeedFinished(j *journal.Journal, prefix string, n int) error {
	const batch = 1000
	sig := make([]byte, 64)
	key := make([]byte, 32)
	for lo := 0; lo < n; lo += batch {
		err := j.Update(func(tx *journal.Tx) error {
			for i := lo; i < min(lo+batch, n); i++ {
				id := fmt.Sprintf("%s%d", prefix, i)
				cid := id + "-g1"
				now := time.Now().UTC()
				req := journal.ClaimRequest{
					OperationID: "claim-" + id, Generation: 1,
					RootFS:    journal.RootFS{Mode: "overlay", Template: "busybox"},
					Resources: journal.Resources{CPUMillis: 500, MemoryBytes: 256 << 20, PIDs: 128},
					Network:   journal.NetworkPolicy{Mode: "deny_all"},
					Process:   journal.Process{Args: []string{"/bin/sleep", "2147483647"}, Env: []string{"PATH=/bin:/usr/bin"}},
				}
				rec := journal.Sandbox{
					ID: id, Generation: 1, State: journal.StateReleased, ContainerID: cid, LeaseID: cid,
					Resources: req.Resources, RootFS: req.RootFS, Epoch: 1, CreatedAt: now, Reason: "released",
					Timings: journal.Timings{LeaseMS: 3, RootFSMS: 5, NetworkMS: 12, RunscMS: 4500, ProofMS: 700, TotalMS: 5220},
					ClaimOp: req.OperationID, ReleaseOp: "release-" + id, Nonce: "00112233445566778899aabbccddeeff",
					Netns: cid, Root: "/var/lib/ctld/scratch/" + cid + "/root", Bundle: "/run/ctld/bundles/" + cid, Request: &req,
				}
				p := proof.Proof{
					Version: proof.Version, OperationID: "release-" + id, NodeID: "node", BootID: "boot", Epoch: 1, SandboxID: id,
					Generation: 1, LeaseID: cid, Clean: true, Time: now, NodeKey: key, Signature: sig,
				}
				for _, c := range []string{"cgroup_removed", "runsc_container_gone", "mounts_gone", "netns_gone", "bundle_removed"} {
					p.Checks = append(p.Checks, proof.Check{Name: c, OK: true, Detail: "absent"})
				}
				// The stored answers are the API's (opaque bytes to the
				// journal), of the size a real one has.
				sb := api.Sandbox{
					ID: id, Generation: 1, State: api.StateReleased, ContainerID: cid, LeaseID: cid, Epoch: 1, CreatedAt: now, Reason: "released",
					Resources: api.Resources{CPUMillis: 500, MemoryBytes: 256 << 20, PIDs: 128}, RootFS: api.RootFS{Mode: "overlay", Template: "busybox"},
					Timings: api.Timings{LeaseMS: 3, RootFSMS: 5, NetworkMS: 12, RunscMS: 4500, ProofMS: 700, TotalMS: 5220},
				}
				claimRes, _ := json.Marshal(api.ClaimResponse{Sandbox: sb})
				relRes, _ := json.Marshal(api.ReleaseResponse{Sandbox: sb, Proof: api.CleanupProofOf(p)})
				for _, put := range []func() error{
					func() error { return tx.PutSandbox(rec) },
					func() error {
						return tx.PutOperation(journal.Operation{ID: req.OperationID, Kind: journal.OpClaim, SandboxID: id, Generation: 1,
							RequestHash: "seed", State: journal.OpDone, Result: claimRes, Epoch: 1, Created: now})
					},
					func() error {
						return tx.PutOperation(journal.Operation{ID: p.OperationID, Kind: journal.OpRelease, SandboxID: id, Generation: 1,
							RequestHash: "seed", State: journal.OpDone, Result: relRes, Epoch: 1, Created: now})
					},
					func() error { return tx.PutProof(p) },
				} {
					if err := put(); err != nil {
						return err
					}
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("seed finished generations: %w", err)
		}
	}
	return nil
}

// TakeOverNext takes j over at the epoch after the journal's, as a test's
// own term (a real primary takes it over at its ha/epoch).
func TakeOverNext(j *journal.Journal) error {
	e, err := j.Epoch()
	if err != nil {
		return err
	}
	return j.TakeOver(e + 1)
}
