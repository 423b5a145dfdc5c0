package api

import (
	"crypto/ed25519"
	"encoding/json"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/proof"
)

func fieldNames(t reflect.Type) []string {
	var out []string
	for f := range t.Fields() {
		out = append(out, f.Name)
	}
	return out
}

// The wire proof and the record have the same fields, so a field added to
// one without the other (and the conversions) fails here.
func TestCleanupProofHasEveryRecordField(t *testing.T) {
	if a, b := fieldNames(reflect.TypeFor[CleanupProof]()), fieldNames(reflect.TypeFor[proof.Proof]()); !slices.Equal(a, b) {
		t.Fatalf("api.CleanupProof fields %v != proof.Proof fields %v", a, b)
	}
	if a, b := fieldNames(reflect.TypeFor[ProofCheck]()), fieldNames(reflect.TypeFor[proof.Check]()); !slices.Equal(a, b) {
		t.Fatalf("api.ProofCheck fields %v != proof.Check fields %v", a, b)
	}
}

// A proof signed by a node, sent as JSON and converted back, verifies: what
// the manager checks is the exact payload the node signed.
func TestCleanupProofRoundTripVerifies(t *testing.T) {
	seed := make([]byte, ed25519.SeedSize)
	id := proof.Identity{NodeID: "0123456789abcdef0123456789abcdef", BootID: "b1", Key: ed25519.NewKeyFromSeed(seed)}
	for _, checks := range [][]proof.Check{
		{{Name: "cgroup_removed", OK: true}, {Name: "netns_removed", OK: false, Detail: "still there"}},
		{}, // empty, not nil: [] and null are different payloads
		nil,
	} {
		rec := proof.Proof{
			OperationID: "op-1", NodeID: id.NodeID, BootID: id.BootID, Epoch: 3, SandboxID: "sb", Generation: 2,
			LeaseID: "sb-g2", Checks: checks, Time: time.Date(2026, 11, 30, 1, 2, 3, 4, time.UTC),
		}
		if err := proof.Sign(id, &rec); err != nil {
			t.Fatal(err)
		}
		wire, err := json.Marshal(CleanupProofOf(rec))
		if err != nil {
			t.Fatal(err)
		}
		var got CleanupProof
		if err := json.Unmarshal(wire, &got); err != nil {
			t.Fatal(err)
		}
		if got.Version != proof.Version {
			t.Errorf("wire proof lost its version: %s", wire)
		}
		if !reflect.DeepEqual(got.Record(), rec) {
			t.Errorf("round trip changed the record:\n got %+v\nwant %+v", got.Record(), rec)
		}
		if err := proof.Verify(got.Record(), id.PublicKey()); err != nil {
			t.Errorf("checks %v: %v", checks, err)
		}
	}
}
