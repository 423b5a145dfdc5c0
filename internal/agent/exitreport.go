package agent

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ctld/ctld/internal/agent/wire"
)

// WriteExitReport leaves the workload's exit status in dir (the agent's
// socket directory, which the host sees) for the host's exit watch: a
// temp file, synced, renamed over wire.ExitReportName, so the host never
// reads half a report. The guest is about to end, so the report must be
// on the host's side before the agent exits.
func WriteExitReport(dir string, code int) error {
	b, err := json.Marshal(wire.ExitReport{Code: code})
	if err != nil {
		return fmt.Errorf("encode exit report: %w", err)
	}
	tmp := filepath.Join(dir, "."+wire.ExitReportName+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("write exit report: %w", err)
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, wire.ExitReportName))
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write exit report: %w", err)
	}
	return nil
}
