package service

import "github.com/ctld/ctld/client"

// fleetUnsupported refuses, in fleet mode (serve --fleet), a create asking
// for what the fleet does not carry out yet, rather than accepting it and
// silently not doing it: idle_timeout_sec (egress counts as activity only
// through the node's network counters, which no node process records
// yet: an idle timer would destroy a sandbox busy on the network).
// on_exit destroy works: node processes record their ctlds' exits in the
// database (nodeagent/exits.go), which exits.go reads.
func (s *Server) fleetUnsupported(req client.CreateRequest) error {
	if s.Manager == nil || !s.Manager.InFleet() {
		return nil
	}
	if req.IdleTimeoutSec > 0 {
		return errorf(client.CodeUnavailable, "idle_timeout_sec is not available in fleet mode yet: node processes do not report egress (activity that keeps a sandbox alive) to the database")
	}
	return nil
}
