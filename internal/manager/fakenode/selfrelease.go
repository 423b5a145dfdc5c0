package fakenode

import (
	"context"
	"fmt"

	"github.com/ctld/ctld/internal/api"
)

// SelfRelease releases sandbox id's current generation under opID as
// ctld does on its own (on_exit release "exit-<cid>", max lifetime
// "expire-<cid>"): no manager sent it; the proof is stored under opID and
// the sandbox's ProofOperationID names it.
func (n *Node) SelfRelease(id, opID string) (api.CleanupProof, error) {
	sb, err := n.Get(context.Background(), id)
	if err != nil {
		return api.CleanupProof{}, err
	}
	r, err := n.Release(context.Background(), id, api.ReleaseRequest{OperationID: opID, Generation: sb.Generation})
	if err != nil {
		return api.CleanupProof{}, fmt.Errorf("self-release %s: %w", id, err)
	}
	return r.Proof, nil
}
