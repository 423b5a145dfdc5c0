package apiserver

import (
	"context"
	"net/http"
)

// The durable block RootFS calls (issue 10): pause, snapshot, the volume's
// head and snapshots, fork and restore.

func (s *Server) handlePause(w http.ResponseWriter, r *http.Request) error {
	return serveSandbox(s, w, r, s.Service.Pause)
}

func (s *Server) handleSnapshot(w http.ResponseWriter, r *http.Request) error {
	return serveSandbox(s, w, r, s.Service.Snapshot)
}

func (s *Server) handleFork(w http.ResponseWriter, r *http.Request) error {
	return serveSandbox(s, w, r, s.Service.Fork)
}

func (s *Server) handleRestore(w http.ResponseWriter, r *http.Request) error {
	return serveSandbox(s, w, r, s.Service.Restore)
}

func (s *Server) handleVolume(w http.ResponseWriter, r *http.Request) error {
	id, err := pathID(r)
	if err != nil {
		return err
	}
	v, err := s.Service.Volume(r.Context(), id)
	return answer(w, v, err)
}

// serveSandbox decodes and validates a mutating call's body, calls fn
// and writes its answer.
func serveSandbox[Req interface{ Validate() error }, Resp any](s *Server, w http.ResponseWriter, r *http.Request, fn func(context.Context, string, Req) (Resp, error)) error {
	id, req, err := decodeFor[Req](s, w, r)
	if err != nil {
		return err
	}
	resp, err := fn(r.Context(), id, req)
	return answer(w, resp, err)
}
