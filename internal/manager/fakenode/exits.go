package fakenode

import (
	"fmt"
	"time"

	"github.com/ctld/ctld/internal/api"
)

// Exit ends sandbox id's workload with code, as ctld's exit watch
// journals it: state exited with the exit status (on_exit keep; the
// sandbox waits for a release).
func (n *Node) Exit(id string, code int) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	sb, ok := n.sandboxes[id]
	if !ok || sb.State != api.StateReady {
		return fmt.Errorf("exit %s: not ready", id)
	}
	sb.State = api.StateExited
	sb.Exit = &api.ExitStatus{Kind: api.ExitNormal, Code: code, At: time.Date(2026, 11, 29, 10, 0, 1, 0, time.UTC), SeenBy: 3}
	sb.Reason = fmt.Sprintf("exited: code %d", code)
	n.sandboxes[id] = sb
	return nil
}
