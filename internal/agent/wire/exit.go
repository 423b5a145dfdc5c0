package wire

// ExitReportName is the file the agent writes in its socket directory
// (the host's agent dir of the generation, bound into the guest) when the
// workload ended, right before the agent, the guest's init, exits with
// the same status: the host reads it once the guest is gone, also a later
// primary after a failover, since the directory outlives the guest.
const ExitReportName = "exit"

// MaxExitReport bounds the report's bytes: the host reads no more.
const MaxExitReport = 256

// ExitReport is the workload's end as the agent saw it.
type ExitReport struct {
	// Code is the exit status; 128+n when signal n ended it.
	Code int `json:"code"`
}
