package guest

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ctld/ctld/internal/agent/wire"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/runsc"
)

// TestExecAndProbeRunAsWorkloadUser: without a user, exec runs as the
// claim's process user, not as root, and the agent is told that user in
// its env, which never holds the nonce (it goes in the nonce file).
func TestExecAndProbeRunAsWorkloadUser(t *testing.T) {
	rec := journal.Sandbox{Nonce: "n", Request: &journal.ClaimRequest{Process: journal.Process{UID: 1000, GID: 1001}}}
	if p := execProcess(rec, ExecRequest{Args: []string{"id"}}); p.UID != 1000 || p.GID != 1001 {
		t.Errorf("exec without a user runs as %d:%d, want the workload's 1000:1001", p.UID, p.GID)
	}
	if p := execProcess(rec, ExecRequest{Args: []string{"id"}, User: &wire.User{UID: 0, GID: 0}}); p.UID != 0 || p.GID != 0 {
		t.Errorf("exec as 0:0 runs as %d:%d", p.UID, p.GID)
	}
	n := New(Config{RunDir: "/run/ctld"}, Wiring{})
	if a := n.agentSpec(rec); !slices.Equal(a.Env, []string{"CTL_AGENT_UID=1000", "CTL_AGENT_GID=1001"}) {
		t.Errorf("agent env %q, want the workload's 1000:1001 and no nonce", a.Env)
	}
}

// TestWriteNonceRootOnly: the agent's nonce file is the nonce alone, mode
// 0400 (only root reads it, in the guest too), and a retried make
// replaces the file an earlier attempt left.
func TestWriteNonceRootOnly(t *testing.T) {
	p := filepath.Join(t.TempDir(), runsc.AgentNonce)
	for _, nonce := range []string{"first", "second"} {
		if err := writeNonce(p, nonce); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm() != 0o400 {
			t.Fatalf("nonce file %v, %v; want mode 0400", fi.Mode(), err)
		}
		if b, err := os.ReadFile(p); err != nil || string(b) != nonce {
			t.Fatalf("nonce file holds %q, %v; want %q", b, err, nonce)
		}
	}
}
