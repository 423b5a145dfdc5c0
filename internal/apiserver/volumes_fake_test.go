package apiserver

import (
	"context"

	"github.com/ctld/ctld/internal/api"
)

// The block volume calls of fakeService: recorded, answered with f.err.

func (f *fakeService) Pause(ctx context.Context, id string, req api.PauseRequest) (api.PauseResponse, error) {
	f.record("Pause %s %s", id, req.OperationID)
	return api.PauseResponse{Sandbox: api.Sandbox{ID: id}}, f.err
}

func (f *fakeService) Snapshot(ctx context.Context, id string, req api.SnapshotRequest) (api.SnapshotResponse, error) {
	f.record("Snapshot %s %s", id, req.Name)
	return api.SnapshotResponse{Snapshot: api.Snapshot{Name: req.Name}}, f.err
}

func (f *fakeService) Volume(ctx context.Context, id string) (api.VolumeInfo, error) {
	f.record("Volume %s", id)
	return api.VolumeInfo{Sandbox: id}, f.err
}

func (f *fakeService) Fork(ctx context.Context, id string, req api.ForkRequest) (api.VolumeInfo, error) {
	f.record("Fork %s from %s %s", id, req.Source, req.Snapshot)
	return api.VolumeInfo{Sandbox: id}, f.err
}

func (f *fakeService) Restore(ctx context.Context, id string, req api.RestoreRequest) (api.VolumeInfo, error) {
	f.record("Restore %s to %s", id, req.Snapshot)
	return api.VolumeInfo{Sandbox: id}, f.err
}
