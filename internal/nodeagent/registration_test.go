package nodeagent

import (
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/manager"
)

// TestRegistrationFromCtldsAnswer: what the node registers is what ctld
// says of itself, with the operator's bounds; an answer without identity
// is refused.
func TestRegistrationFromCtldsAnswer(t *testing.T) {
	key := make([]byte, 32)
	node := func(nbd, addrs int64) api.Node {
		return api.Node{NodeID: "n1", NodeKey: key, Versions: api.Versions{Runsc: "release-1"},
			Capacity: api.NodeCapacity{Allocatable: api.Capacity{CPUMillis: 4000, MemoryBytes: 8 << 30, DiskBytes: 1 << 30, NBDDevices: nbd, Addresses: addrs}}}
	}
	for _, tc := range []struct {
		name      string
		agent     Agent
		node      api.Node
		sandboxes int64
		modes     string
	}{
		{"block with NBD, one sandbox per address", Agent{}, node(16, 250), 250, "overlay,block"},
		{"no NBD: overlay only", Agent{}, node(0, 250), 250, "overlay"},
		{"operator's bound below the pool", Agent{MaxSandboxes: 8}, node(16, 250), 8, "overlay,block"},
		{"operator's bound above the pool", Agent{MaxSandboxes: 999}, node(16, 250), 250, "overlay,block"},
		{"no pool reported: the operator's bound", Agent{MaxSandboxes: 5}, node(0, 0), 5, "overlay"},
	} {
		r, err := tc.agent.registration(tc.node)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		want := manager.NodeAlloc{CPUMillis: 4000, MemoryBytes: 8 << 30, DiskBytes: 1 << 30, Sandboxes: tc.sandboxes}
		if r.Allocatable != want || strings.Join(r.RootModes, ",") != tc.modes || r.NodeID != "n1" || r.Name != "n1" ||
			r.RunscVersion != "release-1" || r.TTL != 15*time.Second {
			t.Errorf("%s: %+v", tc.name, r)
		}
	}
	for _, bad := range []api.Node{{NodeKey: key}, {NodeID: "n1"}} {
		if _, err := (&Agent{}).registration(bad); err == nil {
			t.Errorf("registration of %+v accepted", bad)
		}
	}
}
