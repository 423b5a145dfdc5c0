package apiserver

import "github.com/ctld/ctld/internal/api"

func validClaim() api.ClaimRequest {
	return api.ClaimRequest{
		OperationID: "op-1",
		Generation:  1,
		RootFS:      api.RootFS{Mode: api.RootFSOverlay, Template: "alpine"},
		Resources:   api.Resources{CPUMillis: 500, MemoryBytes: 256 << 20, PIDs: 128},
		Process:     api.Process{Args: []string{"/bin/sleep", "inf"}, Env: []string{"PATH=/bin", "EMPTY="}, Cwd: "/"},
	}
}
