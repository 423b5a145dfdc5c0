package service

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/manager"
	"github.com/ctld/ctld/internal/template"
)

// TestVolumes: an owner's persistent volume is made in a real (directory)
// block store, counts against the disk quota, is mounted by one sandbox
// at a time, cannot be deleted while held, and is gone from the block
// store (and refused by the manager) once deleted. Another owner's key
// never sees or touches it.
func TestVolumes(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	for _, size := range []string{"1000", "-64Ki", "lots", "0"} {
		if _, err := e.a.CreateVolume(invalid(ctx), client.VolumeCreateRequest{Size: size}); errCode(err) != client.CodeInvalidArgument {
			t.Fatalf("volume of size %q: %v", size, err)
		}
	}
	v, err := e.a.CreateVolume(ctx, client.VolumeCreateRequest{Size: "4Mi", Labels: map[string]string{"app": "db"}})
	if err != nil || v.State != client.VolumeReady || v.SizeBytes != 4<<20 || v.Labels["app"] != "db" || !strings.HasPrefix(v.ID, "vol-") {
		t.Fatalf("create volume: %+v, %v", v, err)
	}
	if vs, err := template.ListVolumes(ctx, e.bstore, e.repo); err != nil || len(vs) != 1 || vs[0].ID != v.ID || vs[0].DeviceSize != 4<<20 {
		t.Fatalf("the block store's volumes: %+v, %v", vs, err)
	}
	if h, deleted, err := e.store.VolumeMark(ctx, v.ID); err != nil || deleted || h.Seq == 0 {
		t.Fatalf("the manager's mark of %s: %+v deleted=%v, %v", v.ID, h, deleted, err)
	}
	if u, _ := e.store.Usage(ctx, "team-a"); u.Volumes != 1 || u.DiskBytes != 4<<20 {
		t.Fatalf("team-a's usage: %+v", u)
	}

	// Owner isolation: team-b sees nothing of it and touches nothing.
	if _, err := e.b.Volume(ctx, v.ID); errCode(err) != client.CodeNotFound {
		t.Fatalf("team-b gets team-a's volume: %v", err)
	}
	if _, err := e.b.DeleteVolume(ctx, v.ID); errCode(err) != client.CodeNotFound {
		t.Fatalf("team-b deletes team-a's volume: %v", err)
	}
	if l, err := e.b.Volumes(ctx, 0, ""); err != nil || len(l.Volumes) != 0 {
		t.Fatalf("team-b's volumes: %+v, %v", l, err)
	}
	nodeBefore, _ := e.node.List(ctx)
	if _, err := e.b.Create(ctx, client.CreateRequest{Template: "busybox", Volumes: []client.VolumeMount{{ID: v.ID, Path: "/data"}}}); errCode(err) != client.CodeNotFound {
		t.Fatalf("team-b mounts team-a's volume: %v", err)
	}
	if nodeAfter, _ := e.node.List(ctx); len(nodeAfter.Sandboxes) != len(nodeBefore.Sandboxes) {
		t.Fatalf("a create on another owner's volume reached the node")
	}
	if u, _ := e.store.Usage(ctx, "team-b"); u.Sandboxes != 0 {
		t.Fatalf("team-b holds a share after its refused create: %+v", u)
	}

	// Mounted by one sandbox at a time; not deleted while held.
	sb, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox", Volumes: []client.VolumeMount{{ID: v.ID, Path: "/data"}}})
	if err != nil || sb.State != client.StateReady || len(sb.Volumes) != 1 || sb.Volumes[0].ID != v.ID {
		t.Fatalf("create with the volume: %+v, %v", sb, err)
	}
	if nsb, err := e.node.Get(ctx, sb.ID); err != nil || len(nsb.Volumes) != 1 || nsb.Volumes[0].ID != v.ID || nsb.Volumes[0].Path != "/data" || nsb.Volumes[0].ExpectHead.Seq == 0 {
		t.Fatalf("the node's claim: %+v, %v", nsb.Volumes, err)
	}
	if got, err := e.a.Volume(ctx, v.ID); err != nil || got.HeldBy != sb.ID {
		t.Fatalf("volume held by %q, %v; want %s", got.HeldBy, err, sb.ID)
	}
	if _, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox", Volumes: []client.VolumeMount{{ID: v.ID, Path: "/data"}}}); errCode(err) != client.CodeConflict {
		t.Fatalf("a second sandbox on the held volume: %v", err)
	}
	if _, err := e.a.Create(invalid(ctx), client.CreateRequest{Template: "busybox", Volumes: []client.VolumeMount{{ID: "../x", Path: "/data"}}}); errCode(err) != client.CodeInvalidArgument {
		t.Fatalf("a bad volume id: %v", err)
	}
	if _, err := e.a.DeleteVolume(ctx, v.ID); errCode(err) != client.CodeConflict {
		t.Fatalf("delete of a held volume: %v", err)
	}
	if _, err := e.a.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	d, err := e.a.DeleteVolume(ctx, v.ID, client.IdempotencyKey("del-1"))
	if err != nil || d.State != client.VolumeDeleted {
		t.Fatalf("delete: %+v, %v", d, err)
	}
	if again, err := e.a.DeleteVolume(ctx, v.ID); err != nil || again.State != client.VolumeDeleted {
		t.Fatalf("delete again: %+v, %v", again, err)
	}
	if vs, err := template.ListVolumes(ctx, e.bstore, e.repo); err != nil || len(vs) != 0 {
		t.Fatalf("the block store after the delete: %+v, %v", vs, err)
	}
	if _, deleted, err := e.store.VolumeMark(ctx, v.ID); err != nil || !deleted {
		t.Fatalf("the manager does not remember %s deleted: %v", v.ID, err)
	}
	if _, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox", Volumes: []client.VolumeMount{{ID: v.ID, Path: "/data"}}}); errCode(err) != client.CodeNotFound {
		t.Fatalf("a sandbox on a deleted volume: %v", err)
	}
	if u, _ := e.store.Usage(ctx, "team-a"); u.Volumes != 0 || u.DiskBytes != 0 {
		t.Fatalf("team-a's usage after the delete: %+v", u)
	}

	// The disk quota bounds volumes; nothing is made over it.
	q := quotaOf(10)
	q.DiskBytes = 8 << 20
	if _, err := e.store.SetQuota(ctx, "team-a", q); err != nil {
		t.Fatal(err)
	}
	if _, err := e.a.CreateVolume(ctx, client.VolumeCreateRequest{Size: "16Mi"}); errCode(err) != client.CodeQuotaExceeded {
		t.Fatalf("a volume over the disk quota: %v", err)
	}
	if vs, _ := template.ListVolumes(ctx, e.bstore, e.repo); len(vs) != 0 {
		t.Fatalf("a volume over the quota reached the block store: %+v", vs)
	}

	// Paging.
	for range 3 {
		if _, err := e.a.CreateVolume(ctx, client.VolumeCreateRequest{Size: "1Mi"}); err != nil {
			t.Fatal(err)
		}
	}
	p1, err := e.a.Volumes(ctx, 2, "")
	if err != nil || len(p1.Volumes) != 2 || p1.NextCursor == "" {
		t.Fatalf("page 1: %+v, %v", p1, err)
	}
	p2, err := e.a.Volumes(ctx, 2, p1.NextCursor)
	if err != nil || len(p2.Volumes) != 2 || p2.NextCursor != "" || p2.Volumes[0].ID <= p1.Volumes[1].ID {
		t.Fatalf("page 2: %+v, %v", p2, err)
	}
	resp, _ := e.raw(invalid(ctx), http.MethodGet, "/v1/volumes?cursor=!!", e.keyA, nil, nil)
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("bad cursor: %d", resp.StatusCode)
	}
}

// TestVolumesSettledAtStart: a volume a previous server left being
// created fails (what it made removed), one left being deleted is
// deleted.
func TestVolumesSettledAtStart(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	v, err := e.a.CreateVolume(ctx, client.VolumeCreateRequest{Size: "1Mi"})
	if err != nil {
		t.Fatal(err)
	}
	e.shutdown()
	// A create that stopped after the block store made it, and a delete
	// that stopped before the block store removed it.
	if err := e.store.AdmitVolume(ctx, manager.VolumeAdmission{Owner: "team-a", ID: "vol-halfmade", Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	if _, err := (BlockVolumes{Repo: e.repo, TmpDir: t.TempDir()}).Create(ctx, "vol-halfmade", 1<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.BeginVolumeDelete(ctx, "team-a", v.ID); err != nil {
		t.Fatal(err)
	}
	e.start(nil)
	if got, err := e.a.Volume(ctx, "vol-halfmade"); err != nil || got.State != client.VolumeFailed || got.Reason == "" {
		t.Fatalf("the half-made volume: %+v, %v", got, err)
	}
	if got, err := e.a.Volume(ctx, v.ID); err != nil || got.State != client.VolumeDeleted {
		t.Fatalf("the half-deleted volume: %+v, %v", got, err)
	}
	if vs, err := template.ListVolumes(ctx, e.bstore, e.repo); err != nil || len(vs) != 0 {
		t.Fatalf("the block store after the start: %+v, %v", vs, err)
	}
	if u, _ := e.store.Usage(ctx, "team-a"); u.Volumes != 0 || u.DiskBytes != 0 {
		t.Fatalf("usage: %+v", u)
	}
}
