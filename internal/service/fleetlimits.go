package service

import "github.com/ctld/ctld/client"

// fleetUnsupported refuses, in fleet mode (serve --fleet), a create asking
// for what the fleet does not carry out yet, rather than accepting it and
// silently not doing it: on_exit "destroy" (exits.go reads the guest's
// exit through Manager.NodeSandbox, which in fleet mode is the database's
// view, and no node process records exits there) and idle_timeout_sec
// (egress counts as activity only through the node's network counters,
// which no node process records either: an idle timer would destroy a
// sandbox busy on the network).
func (s *Server) fleetUnsupported(req client.CreateRequest) error {
	if s.Manager == nil || !s.Manager.InFleet() {
		return nil
	}
	if req.OnExit == client.OnExitDestroy {
		return errorf(client.CodeUnavailable, `on_exit "destroy" is not available in fleet mode yet: node processes do not report guest exits to the database`)
	}
	if req.IdleTimeoutSec > 0 {
		return errorf(client.CodeUnavailable, "idle_timeout_sec is not available in fleet mode yet: node processes do not report egress (activity that keeps a sandbox alive) to the database")
	}
	return nil
}
