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

// Snapshot implements apiserver.Service (refused).
func (n *Node) Snapshot(context.Context, string, api.SnapshotRequest) (api.SnapshotResponse, error) {
	return api.SnapshotResponse{}, noBlock("snapshot")
}

// Volume implements apiserver.Service: the head the pauses published.
func (n *Node) Volume(_ context.Context, id string) (api.VolumeInfo, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	h, ok := n.heads[id]
	if !ok {
		return api.VolumeInfo{}, errdefs.Errorf(errdefs.CodeNotFound, "sandbox %q has no volume", id)
	}
	return api.VolumeInfo{Sandbox: id, Head: h}, nil
}

// Fork implements apiserver.Service (refused).
func (n *Node) Fork(context.Context, string, api.ForkRequest) (api.VolumeInfo, error) {
	return api.VolumeInfo{}, noBlock("fork")
}

// Restore implements apiserver.Service (refused).
func (n *Node) Restore(context.Context, string, api.RestoreRequest) (api.VolumeInfo, error) {
	return api.VolumeInfo{}, noBlock("restore")
}
