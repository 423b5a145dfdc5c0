package agent_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/ctld/ctld/internal/agent/wire"
)

// TestWorkloadExitLeavesReport: when the workload ends, the agent (the
// guest's init) exits with its status and leaves the same status in its
// socket directory for the host's exit watch, whole (no temp file left).
func TestWorkloadExitLeavesReport(t *testing.T) {
	for _, tc := range []struct {
		script string
		code   int
	}{{"exit 7", 7}, {"exit 0", 0}, {"kill -9 $$", 137}} {
		dir := t.TempDir()
		sock := filepath.Join(dir, "agent.sock")
		cmd := exec.Command(os.Args[0], "--socket", sock, "--nonce-file", writeNonce(t, dir, "nonce-123"), "--", "/bin/sh", "-c", tc.script)
		cmd.Env = agentEnv()
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if tc.code == 0 && err != nil || tc.code != 0 && (!errors.As(err, &ee) || ee.ExitCode() != tc.code) {
			t.Fatalf("%s: agent ended with %v, want status %d; stderr %s", tc.script, err, tc.code, stderr.String())
		}
		b, err := os.ReadFile(filepath.Join(dir, wire.ExitReportName))
		if err != nil {
			t.Fatalf("%s: no exit report: %v", tc.script, err)
		}
		var r wire.ExitReport
		if err := wire.Decode(b, &r); err != nil || r.Code != tc.code {
			t.Errorf("%s: exit report %q (%v), want code %d", tc.script, b, err, tc.code)
		}
		if _, err := os.Lstat(filepath.Join(dir, "."+wire.ExitReportName+".tmp")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: temp file of the report left: %v", tc.script, err)
		}
	}
}
