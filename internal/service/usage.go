package service

import (
	"context"
	"fmt"

	"github.com/ctld/ctld/internal/manager"
)

// pullUsage pages the node's metering stream (ctld's GET /v1/usage) into
// the store every UsagePull for as long as ctx lasts: each page is
// committed with the cursor, so replicas pulling at once store every
// record once (manager.UsagePuller).
func (s *Server) pullUsage(ctx context.Context) {
	if s.UsagePull <= 0 || s.Manager == nil || s.Manager.Client == nil {
		return
	}
	if s.Manager.Fleet != nil {
		// Each node process pulls its ctld's stream (nodeagent, `node run
		// --usage-pull`): a replica reaches no ctld.
		s.log().Info("usage records are pulled by the node processes in fleet mode")
		return
	}
	st, ok := s.Store.(manager.UsageStore)
	if !ok {
		s.log().Warn("usage records not pulled: the store keeps none", "store", fmt.Sprintf("%T", s.Store))
		return
	}
	p := manager.UsagePuller{Store: st, Source: s.Manager.Client, Log: s.log()}
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		p.Run(ctx, s.UsagePull)
	}()
}
