package service

import (
	"context"

	"github.com/ctld/ctld/internal/manager"
)

// egressGrew reports whether the sandbox sent traffic out since its idle
// timer last looked (issue 23: egress is activity, as exec, file and log
// calls are): the node's counter of its nft chain (egress the policy
// accepted), compared with the total the timer recorded. In fleet mode
// the total is the generation's usage records summed (its node process
// pulls them: nodeagent), so egress shows after ctld's usage interval
// and the node process's pull. A node that cannot say (no sandbox
// network, not reachable, no record yet) counts as no traffic: the
// timer fires as it would without.
func (s *Server) egressGrew(ctx context.Context, t manager.IdleTimer) bool {
	if s.Manager == nil || (s.Manager.Client == nil && !s.Manager.InFleet()) {
		return false
	}
	sb, err := s.Manager.NodeSandbox(ctx, t.SandboxID)
	if err != nil || sb.Network == nil {
		return false
	}
	grew, err := s.Store.SeeIdleEgress(ctx, t.SandboxID, sb.Network.TxBytes)
	if err != nil {
		s.log().Warn("record idle egress", "sandbox", t.SandboxID, "err", err)
		return false
	}
	if grew {
		s.log().Debug("egress counts as activity: idle timer touched", "sandbox", t.SandboxID, "tx_bytes", sb.Network.TxBytes)
	}
	return grew
}
