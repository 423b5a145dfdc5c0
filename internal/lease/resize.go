package lease

import (
	"context"
	"fmt"
)

// Resize writes s's limits on the existing, possibly populated, lease
// s.ID and reads each back: a warm pool member (issue 27) is booted in a
// lease with small neutral limits and takes its claim's limits live. The
// same files as Create (cpuset.cpus only when s names one: a member never
// has one, so the lease inherits its parent's until a claim names it).
// Lowering memory.max below what the lease uses makes the kernel reclaim
// or OOM-kill: the caller checks usage first.
func (m *Manager) Resize(ctx context.Context, s Spec) error {
	if err := s.Validate(); err != nil {
		return fmt.Errorf("resize lease: %w", err)
	}
	r, err := m.open()
	if err != nil {
		return fmt.Errorf("resize lease %s: %w", s.ID, err)
	}
	defer r.Close()
	if err := writeFiles(r, m.rel(s.ID), s.Files()); err != nil {
		return fmt.Errorf("resize lease %s: %w", s.ID, err)
	}
	m.log().InfoContext(ctx, "lease resized", "lease", s.ID,
		"cpu_millis", s.CPUMillis, "memory_bytes", s.MemoryBytes, "pids", s.PIDs, "cpuset", s.Cpuset)
	return nil
}
