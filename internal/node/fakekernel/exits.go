package fakekernel

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/ctld/ctld/internal/agent"
	"github.com/ctld/ctld/internal/runsc"
)

// ExitGuest ends container id's workload with code, as a real guest's
// does: its agent leaves its exit report in the agent socket dir (as
// ctl-agent does), then the guest (sandbox and gofer) ends.
func (k *Kernel) ExitGuest(id string, code int) error {
	k.mu.Lock()
	c, ok := k.containers[id]
	k.mu.Unlock()
	if !ok {
		return fmt.Errorf("exit guest %s: no container", id)
	}
	b, err := os.ReadFile(filepath.Join(c.bundle, "config.json"))
	if err != nil {
		return fmt.Errorf("exit guest %s: %w", id, err)
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("exit guest %s: %w", id, err)
	}
	for _, m := range s.Mounts {
		if m.Destination == runsc.AgentSocketDir {
			if err := agent.WriteExitReport(m.Source, code); err != nil {
				return err
			}
		}
	}
	k.KillGuest(id)
	return nil
}

// OOMKillGuest kills container id's guest at its lease's memory.max:
// memory.events counts the kill, and no agent report is left.
func (k *Kernel) OOMKillGuest(id string) {
	k.mu.Lock()
	if c, ok := k.containers[id]; ok {
		if k.oomKills == nil {
			k.oomKills = map[string]int64{}
		}
		k.oomKills[c.cgroup]++
	}
	k.mu.Unlock()
	k.KillGuest(id)
}
