package node

import (
	"testing"

	"github.com/ctld/ctld/internal/apiserver"
	"github.com/ctld/ctld/internal/apiserver/servicetest"
)

// TestServiceContract: the node over the fake kernel keeps the contract
// the manager's fake node is held to as well.
func TestServiceContract(t *testing.T) {
	servicetest.Run(t, func(t *testing.T) apiserver.Service {
		k, _ := fakeKernel(t)
		r := newRig(t, k)
		r.mustBoot()
		t.Cleanup(func() {
			if got := k.text(); got != "" && !t.Failed() {
				t.Logf("kernel after the contract case (a ready generation may remain):\n%s", got)
			}
		})
		return r.n
	}, servicetest.LiveNetwork)
}
