package service

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/manager"
	"github.com/ctld/ctld/internal/names"
)

// Snapshots, restore and fork of block-mode sandboxes: thin calls of the
// manager's, on the caller's own sandboxes (another owner's are
// not_found like any other call).

// forkOf is where a forked sandbox's files come from; it is kept in the
// sandbox's record so a server that stops between admitting the fork and
// claiming it forks (again: the node answers a done fork as a conflict)
// and claims when it starts.
type forkOf struct {
	Source   string `json:"source"`
	Snapshot string `json:"snapshot,omitempty"`
}

// blockOwned is the caller's sandbox of the URL and its record, refused
// unless its root is block mode.
func (s *Server) blockOwned(r *http.Request, owner, what string) (manager.OwnedSandbox, record, error) {
	o, err := s.owned(r, owner)
	if err != nil {
		return o, record{}, err
	}
	var rec record
	if err := json.Unmarshal(o.Spec, &rec); err != nil {
		return o, rec, fmt.Errorf("decode the spec of %s: %w", o.ID, err)
	}
	if rec.Spec.RootFS.Mode != api.RootFSBlock {
		return o, rec, invalidf("sandbox %s has an %s root: only block-mode roots %s", o.ID, rec.Spec.RootFS.Mode, what)
	}
	return o, rec, nil
}

func checkSnapshotName(field, name string) error {
	if !names.Valid(name) {
		return invalidf("%s %s: %s", field, errdefs.Quote(name), names.Rule)
	}
	return nil
}

func (s *Server) snapshot(w http.ResponseWriter, r *http.Request, owner string) error {
	o, _, err := s.blockOwned(r, owner, "have snapshots")
	if err != nil {
		return err
	}
	var req client.SnapshotRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		return err
	}
	if err := checkSnapshotName("name", req.Name); err != nil {
		return err
	}
	if !o.Active || o.Paused {
		return errorf(client.CodeConflict, "sandbox "+o.ID+" is not running: only a running sandbox is snapshotted")
	}
	res, err := s.Manager.Snapshot(r.Context(), o.ID, req.Name)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, client.Snapshot{Name: res.Snapshot.Name, Generation: res.Snapshot.Generation})
	return nil
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request, owner string) error {
	o, _, err := s.blockOwned(r, owner, "have snapshots")
	if err != nil {
		return err
	}
	out := client.SnapshotList{Snapshots: []client.Snapshot{}}
	v, err := s.Manager.Volume(r.Context(), o.ID)
	if errdefs.CodeOf(err) == errdefs.CodeNotFound {
		// No head published yet: no snapshots.
		writeJSON(w, http.StatusOK, out)
		return nil
	} else if err != nil {
		return err
	}
	for _, sn := range v.Snapshots {
		out.Snapshots = append(out.Snapshots, client.Snapshot{Name: sn.Name, Generation: sn.Generation})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) restore(w http.ResponseWriter, r *http.Request, owner string) error {
	o, _, err := s.blockOwned(r, owner, "have snapshots")
	if err != nil {
		return err
	}
	var req client.RestoreRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		return err
	}
	if err := checkSnapshotName("snapshot", req.Snapshot); err != nil {
		return err
	}
	if !o.Paused || !o.Active {
		return errorf(client.CodeConflict, "sandbox "+o.ID+" is not paused: pause it before a restore")
	}
	if _, err := s.Manager.Restore(r.Context(), o.ID, req.Snapshot); err != nil {
		return err
	}
	return s.answer(w, r, owner, o.ID, http.StatusOK)
}

// fork admits a new sandbox of the source's spec (its own quota share and
// timeout), makes its volume from the source's snapshot or head, and
// claims it.
func (s *Server) fork(w http.ResponseWriter, r *http.Request, owner string) error {
	o, rec, err := s.blockOwned(r, owner, "fork")
	if err != nil {
		return err
	}
	var req client.ForkRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		return err
	}
	if err := checkLabels(req.Labels); err != nil {
		return err
	}
	if req.Snapshot != "" {
		if err := checkSnapshotName("snapshot", req.Snapshot); err != nil {
			return err
		}
	}
	deadline, err := s.deadline(req.TimeoutSec)
	if err != nil {
		return err
	}
	id, err := s.newID()
	if err != nil {
		return err
	}
	rec.Fork = &forkOf{Source: o.ID, Snapshot: req.Snapshot}
	// A persistent volume is one sandbox's at a time: the fork copies the
	// root only.
	rec.Spec.Volumes = nil
	recJSON, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encode spec: %w", err)
	}
	in := manager.Admission{
		Owner: owner, ID: id, Spec: recJSON, Labels: req.Labels, Deadline: deadline, Idle: time.Duration(rec.IdleSec) * time.Second,
		CPUMillis: rec.Spec.Resources.CPUMillis, Memory: rec.Spec.Resources.MemoryBytes, Disk: rec.Spec.Resources.DiskBytes,
	}
	if err := s.Store.AdmitCreate(r.Context(), in); err != nil {
		return err
	}
	s.emit(owner, id, client.EventCreated, "")
	if err := s.forkAndClaim(context.WithoutCancel(r.Context()), owner, id, rec); err != nil {
		return err
	}
	return s.answer(w, r, owner, id, http.StatusCreated)
}

// forkAndClaim makes id's volume from rec.Fork, then claims id. A fork
// the node refuses for good ends the admitted sandbox (its share comes
// back); a conflict is a fork done before (a repeat after a restart).
func (s *Server) forkAndClaim(ctx context.Context, owner, id string, rec record) error {
	_, err := s.Manager.Fork(ctx, rec.Fork.Source, id, rec.Fork.Snapshot)
	switch code := errdefs.CodeOf(err); {
	case err == nil, code == errdefs.CodeConflict:
	case code == errdefs.CodeNotFound || code == errdefs.CodeInvalidArgument || code == errdefs.CodeUnavailable:
		_, msg, _ := classify(err)
		if eerr := s.Store.EndOwnedSandbox(context.WithoutCancel(ctx), id, "fork failed: "+msg); eerr != nil {
			return fmt.Errorf("end %s after its fork failed: %w", id, eerr)
		}
		s.emit(owner, id, client.EventFailed, "fork failed: "+msg)
		return err
	default:
		// Unknown outcome: the create stays unsettled; the next start repeats it.
		return err
	}
	return s.claim(ctx, owner, id, rec.Spec, failedPrefix)
}
