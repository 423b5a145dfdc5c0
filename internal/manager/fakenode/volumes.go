package fakenode

import (
	"context"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
)

// The block volume calls, in memory: a pause is a release that also
// publishes the next head; the other calls are refused (the fake has no
// block store).

// Pause implements apiserver.Service.
func (n *Node) Pause(ctx context.Context, id string, req api.PauseRequest) (api.PauseResponse, error) {
	r, err := n.Release(ctx, id, api.ReleaseRequest(req))
	if err != nil {
		return api.PauseResponse{}, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.heads == nil {
		n.heads = map[string]api.VolumeHead{}
	}
	h, ok := n.pauses[req.OperationID]
	if !ok {
		prev := n.heads[id]
		h = api.VolumeHead{Seq: prev.Seq + 1, Generation: prev.Generation + 1, WriterEpoch: prev.WriterEpoch + 1, Node: n.NodeID}
		n.heads[id] = h
		if n.pauses == nil {
			n.pauses = map[string]api.VolumeHead{}
		}
		n.pauses[req.OperationID] = h
	}
	r.Sandbox.Reason = "paused"
	return api.PauseResponse{Sandbox: r.Sandbox, Head: h, Seal: api.SealResult{Generation: h.Generation}, Proof: r.Proof}, nil
}

func noBlock(call string) error {
	return errdefs.Errorf(errdefs.CodeUnavailable, "%s: this fake node has no block store", call)
}

// Snapshot implements apiserver.Service: the running block generation is
// sealed as the next head and named.
func (n *Node) Snapshot(_ context.Context, id string, req api.SnapshotRequest) (api.SnapshotResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.BlockStore {
		return api.SnapshotResponse{}, noBlock("snapshot")
	}
	if err := req.Validate(); err != nil {
		return api.SnapshotResponse{}, errdefs.Errorf(errdefs.CodeInvalidArgument, "%v", err)
	}
	sb, ok := n.sandboxes[id]
	if !ok || sb.State != api.StateReady || sb.RootFS.Mode != api.RootFSBlock {
		return api.SnapshotResponse{}, errdefs.Errorf(errdefs.CodeConflict, "sandbox %s runs no block generation", id)
	}
	for _, s := range n.snaps[id] {
		if s.Name == req.Name {
			return api.SnapshotResponse{}, errdefs.Errorf(errdefs.CodeConflict, "snapshot %s of %s exists", req.Name, id)
		}
	}
	if n.heads == nil {
		n.heads = map[string]api.VolumeHead{}
	}
	if n.snaps == nil {
		n.snaps = map[string][]api.Snapshot{}
	}
	prev := n.heads[id]
	h := api.VolumeHead{Seq: prev.Seq + 1, Generation: prev.Generation + 1, WriterEpoch: prev.WriterEpoch, Node: n.NodeID}
	n.heads[id] = h
	snap := api.Snapshot{Name: req.Name, Generation: h.Generation}
	n.snaps[id] = append(n.snaps[id], snap)
	return api.SnapshotResponse{Snapshot: snap, Seal: api.SealResult{Generation: h.Generation}}, nil
}

// Volume implements apiserver.Service: the head the pauses and snapshots
// published, and the snapshots.
func (n *Node) Volume(_ context.Context, id string) (api.VolumeInfo, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	h, ok := n.heads[id]
	if !ok {
		return api.VolumeInfo{}, errdefs.Errorf(errdefs.CodeNotFound, "sandbox %q has no volume", id)
	}
	return api.VolumeInfo{Sandbox: id, Head: h, Snapshots: n.snaps[id]}, nil
}

// Fork implements apiserver.Service: dst's head is the source's snapshot
// (or head) generation.
func (n *Node) Fork(_ context.Context, dst string, req api.ForkRequest) (api.VolumeInfo, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.BlockStore {
		return api.VolumeInfo{}, noBlock("fork")
	}
	if _, ok := n.heads[dst]; ok {
		return api.VolumeInfo{}, errdefs.Errorf(errdefs.CodeConflict, "sandbox %s has a volume", dst)
	}
	src, ok := n.heads[req.Source]
	if !ok {
		return api.VolumeInfo{}, errdefs.Errorf(errdefs.CodeNotFound, "sandbox %q has no volume", req.Source)
	}
	gen := src.Generation
	if req.Snapshot != "" {
		s, ok := n.snapshot(req.Source, req.Snapshot)
		if !ok {
			return api.VolumeInfo{}, errdefs.Errorf(errdefs.CodeNotFound, "sandbox %s has no snapshot %s", req.Source, req.Snapshot)
		}
		gen = s.Generation
	}
	h := api.VolumeHead{Seq: 1, Generation: gen, Node: n.NodeID}
	n.heads[dst] = h
	return api.VolumeInfo{Sandbox: dst, Head: h}, nil
}

// Restore implements apiserver.Service: the head moves to the snapshot's
// generation while no generation runs.
func (n *Node) Restore(_ context.Context, id string, req api.RestoreRequest) (api.VolumeInfo, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.BlockStore {
		return api.VolumeInfo{}, noBlock("restore")
	}
	if sb, ok := n.sandboxes[id]; ok && sb.State == api.StateReady {
		return api.VolumeInfo{}, errdefs.Errorf(errdefs.CodeConflict, "sandbox %s generation %d is running", id, sb.Generation)
	}
	s, ok := n.snapshot(id, req.Snapshot)
	if !ok {
		return api.VolumeInfo{}, errdefs.Errorf(errdefs.CodeNotFound, "sandbox %s has no snapshot %s", id, req.Snapshot)
	}
	prev := n.heads[id]
	h := api.VolumeHead{Seq: prev.Seq + 1, Generation: s.Generation, WriterEpoch: prev.WriterEpoch, Node: n.NodeID}
	n.heads[id] = h
	return api.VolumeInfo{Sandbox: id, Head: h, Snapshots: n.snaps[id]}, nil
}

func (n *Node) snapshot(id, name string) (api.Snapshot, bool) {
	for _, s := range n.snaps[id] {
		if s.Name == name {
			return s, true
		}
	}
	return api.Snapshot{}, false
}
