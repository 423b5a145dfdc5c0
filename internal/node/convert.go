package node

import (
	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/node/proof"
)

// signProof signs a cleanup proof as its record (proof.Proof, the payload
// the signature covers) and puts the signed fields back.
func (n *Node) signProof(p *api.CleanupProof) error {
	rec := p.Record()
	if err := proof.Sign(n.d.Identity, &rec); err != nil {
		return err
	}
	*p = api.CleanupProofOf(rec)
	return nil
}
