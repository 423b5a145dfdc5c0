package metrics

import (
	"context"
	"sync"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/apiserver"
)

// maxSeen bounds the generations remembered against replays; past it the
// memory starts over (a replay older than that may count twice).
const maxSeen = 4096

// seen remembers the generations whose timings were counted, per kind.
type seen struct {
	mu sync.Mutex
	m  map[seenKey]struct{}
}

type seenKey struct {
	kind string
	id   string
	gen  uint64
}

// first says whether k is new, and remembers it.
func (s *seen) first(k seenKey) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[k]; ok {
		return false
	}
	if s.m == nil || len(s.m) >= maxSeen {
		s.m = map[seenKey]struct{}{}
	}
	s.m[k] = struct{}{}
	return true
}

func sec(ms float64) float64 { return ms / 1000 }

// ObserveClaim records the step timings of a claim's answer, once per
// generation.
func (m *Metrics) ObserveClaim(s api.Sandbox) {
	if s.Timings.TotalMS <= 0 || !m.seen.first(seenKey{"claim", s.ID, s.Generation}) {
		return
	}
	t := s.Timings
	for step, ms := range map[string]float64{"admit": t.AdmitMS, "lease": t.LeaseMS, "rootfs": t.RootFSMS,
		"network": t.NetworkMS, "runsc": t.RunscMS, "proof": t.ProofMS, "total": t.TotalMS} {
		m.claimStep.WithLabelValues(step).Observe(sec(ms))
	}
	for _, st := range t.Steps {
		m.claimRes.WithLabelValues(st.Resource).Observe(sec(st.MakeMS))
	}
}

// ObserveRelease records the timings of a release's teardown, once per
// generation.
func (m *Metrics) ObserveRelease(s api.Sandbox) {
	t := s.ReleaseTimings
	if t == nil || !m.seen.first(seenKey{"release", s.ID, s.Generation}) {
		return
	}
	m.releaseStep.WithLabelValues("proof").Observe(sec(t.ProofMS))
	m.releaseStep.WithLabelValues("total").Observe(sec(t.TotalMS))
	for _, st := range t.Steps {
		m.releaseRes.WithLabelValues(st.Resource, "remove").Observe(sec(st.RemoveMS))
		m.releaseRes.WithLabelValues(st.Resource, "check").Observe(sec(st.CheckMS))
	}
}

// Service is an apiserver.Service whose claims and releases have their
// recorded step timings observed once they return: the node measures its
// steps, this only reads its answers.
type Service struct {
	apiserver.Service
	M *Metrics
}

func (s Service) Claim(ctx context.Context, id string, req api.ClaimRequest) (api.ClaimResponse, error) {
	r, err := s.Service.Claim(ctx, id, req)
	if err == nil {
		s.M.ObserveClaim(r.Sandbox)
	}
	return r, err
}

func (s Service) Release(ctx context.Context, id string, req api.ReleaseRequest) (api.ReleaseResponse, error) {
	r, err := s.Service.Release(ctx, id, req)
	if err == nil {
		s.M.ObserveRelease(r.Sandbox)
	}
	return r, err
}
