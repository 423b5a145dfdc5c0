package manager

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/names"
)

// Durable block roots (issue 10) as the manager drives them: a pause is a
// release (recorded as one, its proof judged) that also publishes the
// sandbox's head, mirrored in the store; a resume is the next claim with
// the last claim's spec (the node starts it from the head).

// PauseResult is the outcome of Pause.
type PauseResult struct {
	DestroyResult
	Head api.VolumeHead `json:"head"`
	Seal api.SealResult `json:"seal"`
}

// Pause seals the sandbox's running generation as its head on the node,
// releases it, judges the cleanup proof and records the head.
func (m *Manager) Pause(ctx context.Context, id string) (PauseResult, error) {
	if err := names.CheckID("sandbox id", id); err != nil {
		return PauseResult{}, err
	}
	if m.Fleet != nil {
		return m.pausePlaced(ctx, id)
	}
	opID, err := m.newOpID()
	if err != nil {
		return PauseResult{}, err
	}
	op, reused, err := m.Store.BeginRelease(ctx, id, opID)
	if err != nil {
		return PauseResult{}, err
	}
	sb, err := m.Store.Sandbox(ctx, id)
	if err != nil {
		return PauseResult{}, err
	}
	res := PauseResult{DestroyResult: DestroyResult{OperationID: op.OperationID, Reused: reused}}
	var resp api.PauseResponse
	res.Sandbox, res.Verdict, err = m.releaseWith(ctx, "pause", sb, op, func() (api.Sandbox, api.CleanupProof, error) {
		var err error
		resp, err = m.Client.Pause(ctx, id, api.PauseRequest{OperationID: op.OperationID, Generation: op.Generation})
		return resp.Sandbox, resp.Proof, err
	})
	if err != nil {
		return res, err
	}
	if err := m.Store.PublishHead(context.WithoutCancel(ctx), id, resp.Head); err != nil && !(reused && errdefs.CodeOf(err) == errdefs.CodeFenced) {
		return res, fmt.Errorf("record head: %w", err)
	}
	m.log().Info("head recorded", "sandbox", id, "head", resp.Head.Seq, "block_generation", resp.Head.Generation)
	res.Head, res.Seal = resp.Head, resp.Seal
	return res, nil
}

// Resume claims the sandbox's next generation with its last claim's spec;
// the node starts it from the sandbox's head.
func (m *Manager) Resume(ctx context.Context, id string) (CreateResult, error) {
	if err := names.CheckID("sandbox id", id); err != nil {
		return CreateResult{}, err
	}
	ops, err := m.Store.Operations(ctx, id)
	if err != nil {
		return CreateResult{}, err
	}
	for i := len(ops) - 1; i >= 0; i-- {
		op := ops[i]
		if op.Kind != KindClaim || op.State != OpDone || len(op.Request) == 0 {
			continue
		}
		var spec Spec
		if err := json.Unmarshal(op.Request, &spec); err != nil {
			return CreateResult{}, fmt.Errorf("decode the last claim of %s (%s): %w", id, op.OperationID, err)
		}
		if spec.RootFS.Mode != api.RootFSBlock {
			return CreateResult{}, errdefs.Errorf(errdefs.CodeInvalidArgument, "sandbox %s has an %s root: only block-mode roots resume (create it again instead)", id, spec.RootFS.Mode)
		}
		return m.Create(ctx, id, spec)
	}
	return CreateResult{}, errdefs.Errorf(errdefs.CodeNotFound, "sandbox %s has no completed claim to resume", id)
}

// Snapshot seals the running generation under name.
func (m *Manager) Snapshot(ctx context.Context, id, name string) (api.SnapshotResponse, error) {
	if err := m.notPlaced("snapshot"); err != nil {
		return api.SnapshotResponse{}, err
	}
	return m.Client.Snapshot(ctx, id, api.SnapshotRequest{Name: name})
}

// Volume returns the sandbox volume's head, snapshots and generations.
func (m *Manager) Volume(ctx context.Context, id string) (api.VolumeInfo, error) {
	if err := m.notPlaced("volume"); err != nil {
		return api.VolumeInfo{}, err
	}
	return m.Client.Volume(ctx, id)
}

// Fork makes dst a new identity on src's head or snapshot; `sandbox create
// DST --mode block` then runs it from there.
func (m *Manager) Fork(ctx context.Context, src, dst, snapshot string) (api.VolumeInfo, error) {
	if err := m.notPlaced("fork"); err != nil {
		return api.VolumeInfo{}, err
	}
	return m.Client.Fork(ctx, dst, api.ForkRequest{Source: src, Snapshot: snapshot})
}

// Restore moves the sandbox's head to its snapshot and records it.
func (m *Manager) Restore(ctx context.Context, id, snapshot string) (api.VolumeInfo, error) {
	if err := m.notPlaced("restore"); err != nil {
		return api.VolumeInfo{}, err
	}
	v, err := m.Client.Restore(ctx, id, api.RestoreRequest{Snapshot: snapshot})
	if err != nil {
		return v, err
	}
	if _, serr := m.Store.Sandbox(ctx, id); serr == nil {
		if err := m.Store.PublishHead(context.WithoutCancel(ctx), id, v.Head); err != nil {
			return v, fmt.Errorf("record head: %w", err)
		}
	}
	return v, nil
}

// expectHeads sets the heads spec's claim expects at least (issue 21):
// the sandbox volume's recorded head (block mode) and each persistent
// volume's mark. The node refuses a head below them, so a bucket that
// lost or rolled back a head cannot start an older disk; a volume the
// manager deleted is refused here, whatever the bucket's tombstone says.
// A resume's spec (the last claim's) gets today's heads.
func (m *Manager) expectHeads(ctx context.Context, id string, spec Spec) (Spec, error) {
	spec.RootFS.ExpectHead = api.VolumeHead{}
	if spec.RootFS.Mode == api.RootFSBlock {
		h, err := m.Store.Head(ctx, id)
		if err != nil {
			return spec, err
		}
		spec.RootFS.ExpectHead = api.VolumeHead{Seq: h.Seq, Generation: h.Generation}
	}
	vs := make([]api.VolumeMount, len(spec.Volumes))
	for i, v := range spec.Volumes {
		h, deleted, err := m.Store.VolumeMark(ctx, v.ID)
		if err != nil {
			return spec, err
		}
		if deleted {
			return spec, errdefs.Errorf(errdefs.CodeConflict, "volume %s was deleted (volume rm); its ID is not reused", v.ID)
		}
		vs[i] = api.VolumeMount{ID: v.ID, Path: v.Path, ExpectHead: h}
	}
	if spec.Volumes != nil {
		spec.Volumes = vs
	}
	return spec, nil
}

// raiseVolumeMarks records the heads sb's volumes attached or published.
func (m *Manager) raiseVolumeMarks(ctx context.Context, sb api.Sandbox) error {
	for _, v := range sb.Volumes {
		if v.Head == nil {
			continue
		}
		if err := m.Store.RaiseVolumeMark(ctx, v.ID, api.VolumeHead{Seq: v.Head.Seq, Generation: v.Head.Generation}); err != nil {
			return err
		}
	}
	return nil
}
