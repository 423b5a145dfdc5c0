package node

import (
	"encoding/json"

	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/proof"
)

// Answers encodes the answer a finished operation stores in the journal
// (Operation.Result): the edge's wire form (apiserver.Answers), so a
// repeat of the operation id gets exactly the bytes the first call got,
// across failover, and node never sees a wire type. Claim, Release and
// Pause return what it encoded.
type Answers interface {
	// Claimed is the answer of a claim whose generation s is ready.
	Claimed(s journal.Sandbox) (json.RawMessage, error)
	// Released is the answer of a release that ended s with proof p.
	Released(s journal.Sandbox, p proof.Proof) (json.RawMessage, error)
	// Paused is the answer of a pause that published s.Seal and ended s
	// with proof p.
	Paused(s journal.Sandbox, p proof.Proof) (json.RawMessage, error)
}

// ReleaseRequest asks to end a sandbox's generation Generation. Its JSON
// is what the operation's request hash covers (the wire request's).
type ReleaseRequest struct {
	OperationID string `json:"operation_id"`
	Generation  uint64 `json:"generation"`
}

// PauseRequest asks to seal and publish the running generation, then end
// it; a zero Generation is whichever runs. Its JSON is what the
// operation's request hash covers (the wire request's).
type PauseRequest struct {
	OperationID string `json:"operation_id"`
	Generation  uint64 `json:"generation,omitempty"`
}
