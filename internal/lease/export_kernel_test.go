package lease

import (
	"os/exec"
	"testing"
)

// For the lease contract (contract_kernel_test.go, package lease_test).
var KernelManager = kernelManager

// StartIn starts cmd inside lease id of m (startIn).
func StartIn(t *testing.T, m *Manager, id string, cmd *exec.Cmd) error { return startIn(t, m, id, cmd) }
