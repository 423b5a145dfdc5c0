package node

import (
	"encoding/json"
	"fmt"

	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/proof"
)

// testAnswers is the node's Answers in its own tests: the domain records
// as they are (the wire's answers are apiserver's, tested there).
type testAnswers struct{}

// answer is what testAnswers stores for an operation.
type answer struct {
	Sandbox journal.Sandbox    `json:"sandbox"`
	Proof   proof.Proof        `json:"proof"`
	Head    journal.VolumeHead `json:"head"`
	// Seal is the pause's seal as the node journaled it.
	Seal journal.SealResult `json:"seal"`
}

func (testAnswers) Claimed(s journal.Sandbox) (json.RawMessage, error) {
	return json.Marshal(answer{Sandbox: s})
}

func (testAnswers) Released(s journal.Sandbox, p proof.Proof) (json.RawMessage, error) {
	return json.Marshal(answer{Sandbox: s, Proof: p})
}

func (testAnswers) Paused(s journal.Sandbox, p proof.Proof) (json.RawMessage, error) {
	a := answer{Sandbox: s, Proof: p}
	if s.Seal != nil {
		a.Head = s.Seal.Head
		if len(s.Seal.Result) > 0 {
			if err := json.Unmarshal(s.Seal.Result, &a.Seal); err != nil {
				return nil, err
			}
		}
	}
	return json.Marshal(a)
}

// decodeAnswer decodes an answer a call returned with err.
func decodeAnswer(raw json.RawMessage, err error) (answer, error) {
	var a answer
	if err != nil {
		return a, err
	}
	if err := json.Unmarshal(raw, &a); err != nil {
		return a, fmt.Errorf("decode answer %s: %w", raw, err)
	}
	return a, nil
}
