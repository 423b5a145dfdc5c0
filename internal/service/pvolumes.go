package service

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/blockstore"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/manager"
	"github.com/ctld/ctld/internal/template"
)

// Persistent volumes of an owner (/v1/volumes): ext4 file systems in the
// block store that sandboxes mount (create's "volumes") and that outlive
// them. The service names them ("vol-" + 80 random bits), so an owner can
// neither guess nor collide with another's. The store records a volume
// before the block store makes it and before it is deleted there; a
// server that stops in between settles it when it starts
// (settleVolumes).

// VolumeBackend makes and deletes volumes in the block store.
type VolumeBackend interface {
	// Create makes an empty ext4 volume of size bytes and returns its head.
	Create(ctx context.Context, id string, size int64) (api.VolumeHead, error)
	// Remove deletes a volume; one that is not there is success.
	Remove(ctx context.Context, id string) error
}

// BlockVolumes is the VolumeBackend of a block store repository (the
// node's, from ctld's configuration file).
type BlockVolumes struct {
	Repo *blockstore.Repo
	// TmpDir holds a volume's image while it is built.
	TmpDir string
}

// Create builds the image and imports it as the volume's generation 0.
func (b BlockVolumes) Create(ctx context.Context, id string, size int64) (api.VolumeHead, error) {
	h, err := template.CreateVolume(ctx, b.Repo, id, size, b.TmpDir)
	if errors.Is(err, template.ErrVolumeExists) {
		return api.VolumeHead{}, errdefs.Errorf(errdefs.CodeConflict, "volume %s exists in the block store", id)
	}
	return api.VolumeHead{Seq: h.Seq, Generation: h.Generation}, err
}

// Remove deletes the volume (its data goes at the next store gc).
func (b BlockVolumes) Remove(ctx context.Context, id string) error {
	if err := template.RemoveVolume(ctx, b.Repo, id); err != nil && !errors.Is(err, template.ErrVolumeNotFound) {
		return err
	}
	return nil
}

// maxVolumeBytes bounds one volume (the owner's disk quota bounds the sum).
const maxVolumeBytes = 1 << 40

func (s *Server) newVolumeID() (string, error) {
	var b [10]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generate volume id: %w", err)
	}
	return "vol-" + hex.EncodeToString(b[:]), nil
}

func (s *Server) volumeBackend() (VolumeBackend, error) {
	if s.Volumes == nil {
		return nil, errorf(client.CodeUnavailable, "this server has no block store for volumes (see ctl-manager serve --help)")
	}
	return s.Volumes, nil
}

func volumeView(v manager.OwnedVolume) client.Volume {
	out := client.Volume{ID: v.ID, State: v.State, SizeBytes: v.Size, Labels: v.Labels, CreatedAt: v.CreatedAt, HeldBy: v.HeldBy, Reason: v.Reason}
	if out.Labels == nil {
		out.Labels = map[string]string{}
	}
	return out
}

func (s *Server) createVolume(w http.ResponseWriter, r *http.Request, owner string) error {
	var req client.VolumeCreateRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		return err
	}
	if err := checkLabels(req.Labels); err != nil {
		return err
	}
	size, err := manager.ParseMemory(req.Size)
	if err != nil {
		return invalidf("size: %v", err)
	}
	if size <= 0 || size%blockstore.DefaultChunkSize != 0 || size > maxVolumeBytes {
		return invalidf("size %s: a positive multiple of 64Ki, at most 1Ti", errdefs.Quote(req.Size))
	}
	vols, err := s.volumeBackend()
	if err != nil {
		return err
	}
	id, err := s.newVolumeID()
	if err != nil {
		return err
	}
	// Leased before it is admitted: another replica settles it only once
	// this one is gone (replica.go).
	lease := manager.OpLease{ID: leaseVolume + "/" + id, Kind: leaseVolume, Owner: owner, Holder: s.ReplicaID}
	if err := s.holdLease(r.Context(), lease); err != nil {
		return err
	}
	defer s.letGo(r.Context(), lease.ID, true)
	if err := s.Store.AdmitVolume(r.Context(), manager.VolumeAdmission{Owner: owner, ID: id, Size: size, Labels: req.Labels}); err != nil {
		return err
	}
	// A caller that goes away does not abandon the create.
	if err := s.makeVolume(context.WithoutCancel(r.Context()), vols, id, size); err != nil {
		return err
	}
	v, err := s.Store.OwnedVolume(context.WithoutCancel(r.Context()), owner, id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, volumeView(v))
	return nil
}

// makeVolume makes an admitted volume in the block store, records its
// head (the mark its claims expect at least) and settles it: ready, or
// failed (its share back) when the block store refused.
func (s *Server) makeVolume(ctx context.Context, vols VolumeBackend, id string, size int64) error {
	h, err := vols.Create(ctx, id, size)
	if err == nil {
		err = s.Manager.Store.RaiseVolumeMark(ctx, id, h)
	}
	if err != nil {
		s.log().Warn("volume create failed", "volume", id, "err", err)
		// What the failed create left is removed; the id is never reused.
		if rerr := vols.Remove(ctx, id); rerr != nil {
			s.log().Warn("remove what a failed volume create left", "volume", id, "err", rerr)
		}
		_, msg, _ := classify(err)
		return errors.Join(err, s.Store.SettleVolume(ctx, id, false, "create failed: "+msg))
	}
	return s.Store.SettleVolume(ctx, id, true, "")
}

func (s *Server) ownedVolume(r *http.Request, owner string) (manager.OwnedVolume, error) {
	id := r.PathValue("id")
	if err := checkID(id); err != nil {
		return manager.OwnedVolume{}, err
	}
	return s.Store.OwnedVolume(r.Context(), owner, id)
}

func (s *Server) getVolume(w http.ResponseWriter, r *http.Request, owner string) error {
	v, err := s.ownedVolume(r, owner)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, volumeView(v))
	return nil
}

func (s *Server) listVolumes(w http.ResponseWriter, r *http.Request, owner string) error {
	q := r.URL.Query()
	limit := defaultPage
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxPage {
			return invalidf("limit must be 1 to %d", maxPage)
		}
		limit = n
	}
	after := ""
	if c := q.Get("cursor"); c != "" {
		b, err := base64.RawURLEncoding.DecodeString(c)
		if err != nil || checkID(string(b)) != nil {
			return invalidf("bad cursor")
		}
		after = string(b)
	}
	vs, err := s.Store.OwnedVolumes(r.Context(), owner, after, limit+1)
	if err != nil {
		return err
	}
	out := client.VolumeList{Volumes: []client.Volume{}}
	for i, v := range vs {
		if i == limit {
			out.NextCursor = base64.RawURLEncoding.EncodeToString([]byte(vs[i-1].ID))
			break
		}
		out.Volumes = append(out.Volumes, volumeView(v))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// deleteVolume deletes a volume no active sandbox holds: recorded
// deleting, remembered deleted by the manager (its claims are refused
// from then on, whatever the bucket says), removed from the block store,
// recorded deleted (its share back).
func (s *Server) deleteVolume(w http.ResponseWriter, r *http.Request, owner string) error {
	v, err := s.ownedVolume(r, owner)
	if err != nil {
		return err
	}
	vols, err := s.volumeBackend()
	if err != nil {
		return err
	}
	lease := manager.OpLease{ID: leaseVolume + "/" + v.ID, Kind: leaseVolume, Owner: owner, Holder: s.ReplicaID}
	if err := s.holdLease(r.Context(), lease); err != nil {
		return err
	}
	defer s.letGo(r.Context(), lease.ID, true)
	if v, err = s.Store.BeginVolumeDelete(r.Context(), owner, v.ID); err != nil {
		return err
	}
	if v.State == manager.VolumeDeleting {
		if err := s.removeVolume(context.WithoutCancel(r.Context()), vols, v.ID); err != nil {
			return err
		}
		if v, err = s.Store.OwnedVolume(context.WithoutCancel(r.Context()), owner, v.ID); err != nil {
			return err
		}
	}
	writeJSON(w, http.StatusOK, volumeView(v))
	return nil
}

func (s *Server) removeVolume(ctx context.Context, vols VolumeBackend, id string) error {
	if err := s.Manager.Store.MarkVolumeDeleted(ctx, id); err != nil {
		return err
	}
	if err := vols.Remove(ctx, id); err != nil {
		return err
	}
	return s.Store.FinishVolumeDelete(ctx, id)
}

// settleVolumes ends what a previous server (or a dead replica) left: a
// create that stopped midway fails (what it made is removed; a caller
// creates again), a delete is completed. A volume whose create or delete
// a live replica runs (its lease is live) is left to it. It runs at the
// start and in the sweeper's slower cycle.
func (s *Server) settleVolumes(ctx context.Context) error {
	pending, err := s.Store.UnsettledVolumes(ctx)
	if err != nil || len(pending) == 0 {
		return err
	}
	vols, err := s.volumeBackend()
	if err != nil {
		s.log().Warn("volumes left unsettled by the previous server wait for a block store", "count", len(pending))
		return nil
	}
	for _, v := range pending {
		lease := manager.OpLease{ID: leaseVolume + "/" + v.ID, Kind: leaseVolume, Owner: v.Owner, Holder: s.ReplicaID}
		if s.holdLease(ctx, lease) != nil {
			continue
		}
		s.log().Info("settling a volume the previous server left "+v.State, "volume", v.ID, "owner", v.Owner)
		switch v.State {
		case manager.VolumeCreating:
			err = vols.Remove(ctx, v.ID)
			if err == nil {
				err = s.Store.SettleVolume(ctx, v.ID, false, "the server stopped during the create")
			}
		case manager.VolumeDeleting:
			err = s.removeVolume(ctx, vols, v.ID)
		}
		s.letGo(ctx, lease.ID, err == nil)
		if err != nil {
			return fmt.Errorf("settle volume %s: %w", v.ID, err)
		}
	}
	return nil
}
