package servicestoretest

import (
	"context"
	"testing"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/manager"
)

// claimer is the part of the manager's store a create's claim uses.
type claimer interface {
	BeginClaim(ctx context.Context, in manager.ClaimIntent) (manager.OperationRecord, bool, error)
	FailOperation(ctx context.Context, opID, msg string) error
	Operations(ctx context.Context, id string) ([]manager.OperationRecord, error)
}

// failedSaysWhy: a failed sandbox always carries its reason. A create
// failed for good (FailCreate) fails its pending claim and ends the
// owner's sandbox in one step, share back; a claim failed alone
// (FailOperation) leaves the reason with the failed state; no write takes
// an empty reason.
func failedSaysWhy(t *testing.T, open Opener) {
	ctx := context.Background()
	s, _ := newStore(t, open)
	c, ok := s.(claimer)
	if !ok {
		t.Fatalf("%T does not record claims", s)
	}
	if _, err := s.CreateOwner(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"sb-a", "sb-b"} {
		if err := s.AdmitCreate(ctx, manager.Admission{Owner: "t", ID: id, Spec: []byte("{}"), CPUMillis: 100, Memory: 1 << 20}); err != nil {
			t.Fatal(err)
		}
		if _, _, err := c.BeginClaim(ctx, manager.ClaimIntent{SandboxID: id, OperationID: "op-" + id, Request: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
	}
	for name, err := range map[string]error{
		"FailCreate without a reason":      s.FailCreate(ctx, "sb-a", "x", ""),
		"FailCreate without an op error":   s.FailCreate(ctx, "sb-a", "", "x"),
		"EndOwnedSandbox without a reason": s.EndOwnedSandbox(ctx, "sb-a", ""),
		"FailOperation without a reason":   c.FailOperation(ctx, "op-sb-a", ""),
	} {
		if errdefs.CodeOf(err) != errdefs.CodeInvalidArgument {
			t.Errorf("%s: %v, want invalid_argument", name, err)
		}
	}
	if o, err := s.OwnedSandbox(ctx, "t", "sb-a"); err != nil || !o.Active || o.State != string(api.StateClaiming) {
		t.Fatalf("after refused writes: %+v, %v; want it active and claiming", o, err)
	}

	if err := s.FailCreate(ctx, "sb-a", "internal: node said no", "create interrupted: gone"); err != nil {
		t.Fatal(err)
	}
	o, err := s.OwnedSandbox(ctx, "t", "sb-a")
	if err != nil || o.Active || o.State != string(api.StateFailed) || o.Reason != "create interrupted: gone" || o.StateReason != "internal: node said no" {
		t.Fatalf("failed create: %+v, %v; want ended, failed, with both reasons", o, err)
	}
	ops, err := c.Operations(ctx, "sb-a")
	if err != nil || len(ops) != 1 || ops[0].State != manager.OpFailed || ops[0].Error != "internal: node said no" {
		t.Fatalf("failed create's claim: %+v, %v; want failed with the error", ops, err)
	}
	if u, err := s.Usage(ctx, "t"); err != nil || u.Sandboxes != 1 {
		t.Fatalf("usage %+v, %v; want sb-a's share back (1 left)", u, err)
	}
	// Again: nothing changes (its claim is no longer pending, it is ended).
	if err := s.FailCreate(ctx, "sb-a", "other", "other"); err != nil {
		t.Fatal(err)
	}
	if o, err := s.OwnedSandbox(ctx, "t", "sb-a"); err != nil || o.Reason != "create interrupted: gone" {
		t.Fatalf("failed twice: %+v, %v; want the first reason", o, err)
	}

	if err := c.FailOperation(ctx, "op-sb-b", "invalid_argument: no image"); err != nil {
		t.Fatal(err)
	}
	if o, err := s.OwnedSandbox(ctx, "t", "sb-b"); err != nil || !o.Active || o.State != string(api.StateFailed) || o.StateReason != "invalid_argument: no image" {
		t.Fatalf("claim failed alone: %+v, %v; want failed with the reason, still active", o, err)
	}
}
