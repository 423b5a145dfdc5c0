package apiserver

import (
	"context"
	"net/http"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
)

// UsageService is the metering stream (issue 22 §2): GET /v1/usage.
type UsageService interface {
	Usage(ctx context.Context, q api.UsageQuery) (api.UsagePage, error)
}

func (s *Server) handleUsage(w http.ResponseWriter, r *http.Request) error {
	q, err := api.ParseUsageQuery(r.URL.Query())
	if err != nil {
		return err
	}
	if s.Usage == nil {
		return errdefs.Errorf(errdefs.CodeUnavailable, "usage metering is not served here")
	}
	p, err := s.Usage.Usage(r.Context(), q)
	return answer(w, p, err)
}

var _ UsageService = Adapter{}

// Usage reads the node's metering stream.
func (a Adapter) Usage(ctx context.Context, q api.UsageQuery) (api.UsagePage, error) {
	p, err := a.N.Usage(ctx, q.After, q.Limit, q.Ack)
	if err != nil {
		return api.UsagePage{}, err
	}
	return apiUsagePage(q.After, p), nil
}

func apiUsagePage(after uint64, p journal.UsagePage) api.UsagePage {
	out := api.UsagePage{Records: make([]api.UsageRecord, 0, len(p.Records)), Next: after, First: p.First, Last: p.Last}
	for _, r := range p.Records {
		out.Records = append(out.Records, api.UsageRecord{
			Seq: r.Seq, SandboxID: r.SandboxID, Generation: r.Generation, Final: r.Final, Epoch: r.Epoch,
			Start: r.Start, End: r.End, Usage: apiUsage(r.Usage),
		})
		out.Next = r.Seq
	}
	return out
}

func apiUsage(u journal.Usage) api.Usage { return api.Usage(u) }
