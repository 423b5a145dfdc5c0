package fakenode_test

import (
	"testing"

	"github.com/ctld/ctld/internal/apiserver"
	"github.com/ctld/ctld/internal/apiserver/servicetest"
	"github.com/ctld/ctld/internal/manager/fakenode"
)

// TestServiceContract: the manager's fake node keeps the node's contract
// (internal/node runs the same suite).
func TestServiceContract(t *testing.T) {
	servicetest.Run(t, func(*testing.T) apiserver.Service { return fakenode.New("node-a") }, servicetest.LiveNetwork, servicetest.GuestAgent)
}
