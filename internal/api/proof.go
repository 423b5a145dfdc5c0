package api

import "github.com/ctld/ctld/internal/proof"

// CleanupProofOf is the wire form of a proof record. It carries every field,
// so Record rebuilds the record the signature was made over.
func CleanupProofOf(p proof.Proof) CleanupProof {
	var checks []ProofCheck
	if p.Checks != nil {
		checks = make([]ProofCheck, len(p.Checks))
		for i, c := range p.Checks {
			checks[i] = ProofCheck(c)
		}
	}
	return CleanupProof{
		Version: p.Version, OperationID: p.OperationID, NodeID: p.NodeID, BootID: p.BootID, Epoch: p.Epoch,
		SandboxID: p.SandboxID, Generation: p.Generation, LeaseID: p.LeaseID, Checks: checks, Clean: p.Clean,
		Time: p.Time, NodeKey: p.NodeKey, Signature: p.Signature,
	}
}

// Record is the proof record of a wire proof, the value proof.Verify
// checks: a verifier checks the payload the node signed, whatever this
// type's JSON looks like.
func (p CleanupProof) Record() proof.Proof {
	var checks []proof.Check
	if p.Checks != nil {
		checks = make([]proof.Check, len(p.Checks))
		for i, c := range p.Checks {
			checks[i] = proof.Check(c)
		}
	}
	return proof.Proof{
		Version: p.Version, OperationID: p.OperationID, NodeID: p.NodeID, BootID: p.BootID, Epoch: p.Epoch,
		SandboxID: p.SandboxID, Generation: p.Generation, LeaseID: p.LeaseID, Checks: checks, Clean: p.Clean,
		Time: p.Time, NodeKey: p.NodeKey, Signature: p.Signature,
	}
}
