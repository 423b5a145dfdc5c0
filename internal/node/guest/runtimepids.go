package guest

// A lease's pids.max counts host tasks: besides the workload's processes
// (each guest process is a ptrace stub process on the host) it holds the
// runtime's own threads, the sentry's and the gofer's, whose number rises
// with the node's load (Go starts a thread for each blocked syscall). The
// claim's PIDs are the workload's; Config.RuntimePIDs is added on top of
// them (docs/operations.md, "Leases").
const (
	// DefaultRuntimePIDs is ctld's --runtime-pids default: twice what a
	// ready guest's runtime held at its peak in the test VM with 8 claims
	// booting at once (pids.peak 57-66: sentry 20-23 threads, gofer
	// 15-17, ptrace stubs 15-22, the log shim 5-6), for a slower node.
	DefaultRuntimePIDs = 128
	// MaxRuntimePIDs bounds the setting far below the kernel's limit.
	MaxRuntimePIDs = 65536
)
