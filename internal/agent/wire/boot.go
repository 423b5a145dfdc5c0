package wire

// BootReportName is the file a cold agent writes in its socket directory
// once its workload started (after the readiness answer, off its path):
// where its boot went, for the host's claim log and benchmarks. The guest
// writes it, so the host bounds what it reads (MaxBootReport) and treats
// it as the guest's word, never as a proof.
const BootReportName = "boot"

// MaxBootReport bounds the report's bytes: the host reads no more.
const MaxBootReport = 512

// BootReport is a cold agent's boot in its own clock, in milliseconds.
type BootReport struct {
	// RuntimeMS: from the process's start (the sentry's exec of the
	// agent) to Main (the Go runtime's start-up); 10 ms resolution.
	RuntimeMS float64 `json:"runtime_ms"`
	// ListenMS: Main to the socket listening (flags, nonce file, socket).
	ListenMS float64 `json:"listen_ms"`
	// StartMS: the socket listening to the workload's fork+exec done.
	StartMS float64 `json:"start_ms"`
}

// ClaimReportName is the file a warm agent writes in its socket directory
// once its claim started the workload (after the answer, off its path):
// where the claim call went. The guest's word, bounded by MaxBootReport.
const ClaimReportName = "claim"

// ClaimReport is a warm agent's claim in its own clock, in milliseconds.
type ClaimReport struct {
	// HostnameMS: the claim's hostname set and CAP_SYS_ADMIN dropped.
	HostnameMS float64 `json:"hostname_ms"`
	// StartMS: the workload's start: with Preforked, the pre-forked
	// process's identity switch and check (its exec runs on after);
	// without, a fork+exec.
	StartMS   float64 `json:"start_ms"`
	Preforked bool    `json:"preforked"`
}
