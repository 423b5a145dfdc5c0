// Package guest is the node's guest concern (issue 26): the entries of a
// generation's logs, lease cgroup, agent dir, OCI bundle and runsc
// container; the agent's client, its socket dir and the calls through it
// (exec, sessions, files); the readiness proof that ends the boot CPU
// allowance; runsc exec; and the guest's logs. The node registers the
// entries and delegates its public guest calls here.
package guest

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"syscall"
	"time"

	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/lease"
	"github.com/ctld/ctld/internal/logging"
	"github.com/ctld/ctld/internal/node/resource"
	"github.com/ctld/ctld/internal/runsc"
)

// The real subsystems are what the interfaces below describe.
var (
	_ Leases  = (*lease.Manager)(nil)
	_ Runtime = (*runsc.Runtime)(nil)
)

// Leases makes and removes the cgroup leases of generations
// (*lease.Manager; node/fakekernel's Leases in unit tests).
type Leases interface {
	Create(ctx context.Context, s lease.Spec) error
	SetCPUMax(ctx context.Context, id string, millis int64) error
	// Resize writes a live lease's limits (a warm member's claim).
	Resize(ctx context.Context, s lease.Spec) error
	Remove(ctx context.Context, id string) error
	Kill(ctx context.Context, id string) error
	Populated(ctx context.Context, id string) (bool, error)
	List(ctx context.Context) ([]string, error)
	Stats(ctx context.Context, id string) (lease.Stats, error)
	CheckGone(ctx context.Context, id string) (ok bool, detail string)
	Dir(id string) string
	CgroupsPath(id string) string
}

// Runtime runs the generations' guests (runsc containers; *runsc.Runtime).
type Runtime interface {
	Create(ctx context.Context, id, bundleDir string) error
	Start(ctx context.Context, id string) error
	Exec(ctx context.Context, id string, p runsc.ExecProcess, stdin io.Reader, stdout, stderr io.Writer) (int, error)
	Kill(ctx context.Context, id string, sig syscall.Signal, all bool) error
	Delete(ctx context.Context, id string) error
	Known() ([]string, error)
	CheckGone(ctx context.Context, id string) (ok bool, detail string)
	LogRoot() string
	ContainerLogDir(id string) string
}

// Nameservers is the network concern's answer to what a generation's
// resolv.conf names (none: the bundle gets no resolv.conf).
type Nameservers interface {
	Nameservers(rec journal.Sandbox) ([]netip.Addr, error)
}

// NameserversFunc is a function as a Nameservers.
type NameserversFunc func(rec journal.Sandbox) ([]netip.Addr, error)

// Nameservers implements Nameservers.
func (f NameserversFunc) Nameservers(rec journal.Sandbox) ([]netip.Addr, error) { return f(rec) }

// Config is the guest concern's part of the node's configuration (see
// node.Config for each field).
type Config struct {
	RunDir                            string
	DefaultArgs                       []string
	GuestOOMScoreAdj                  int
	AgentBinary                       string
	ReadyTimeout                      time.Duration
	BootCPUMillis                     int64
	AgentCallTimeout, AgentStreamIdle time.Duration
	AgentListBytes                    int64
	ExecTimeoutDefault, ExecIdle      time.Duration
}

// Deps are the subsystems the guest concern drives; main builds them
// (node.Deps.Guest). A new one is a field here and its wiring in
// cmd/ctld: nothing in the node changes.
type Deps struct {
	Leases  Leases  // *lease.Manager
	Runtime Runtime // *runsc.Runtime
	// AgentDirs and AgentPeers confine each generation's agent socket dir
	// and check its peer (agentsock.go); nil: PlainDirs{} and AnyPeer{}.
	AgentDirs  AgentDirs
	AgentPeers AgentPeers
}

// Wiring is what the node passes the guest concern: its subsystems and
// what it asks of the node.
type Wiring struct {
	Deps
	Nameservers Nameservers
	// Begin starts an operation of the primary's term (op.Term.Begin),
	// Live says whether the term still lets effects be made, and Sandbox
	// reads a sandbox's record from the journal (errdefs not_found).
	Begin   func(ctx context.Context) (context.Context, func(), error)
	Live    func() error
	Sandbox func(id string) (journal.Sandbox, error)
	Log     *slog.Logger
}

// Guest is the node's guest concern.
type Guest struct {
	cfg Config
	d   Wiring
	log *slog.Logger
}

// New is the guest concern over d.
func New(cfg Config, d Wiring) *Guest {
	if d.AgentDirs == nil {
		d.AgentDirs = PlainDirs{}
	}
	if d.AgentPeers == nil {
		d.AgentPeers = AnyPeer{}
	}
	if d.Live == nil {
		d.Live = func() error { return nil } // a Guest outside a node: always live
	}
	return &Guest{cfg: cfg, d: d, log: logging.OrDiscard(d.Log)}
}

// Register adds the guest concern's entries to b in claim order: the log
// dir before the lease (the log writer of runsc create needs it) before
// the agent dir, the bundle and runsc (last: the guest). The lease and
// runsc are absent without their subsystems; g may be nil where only the
// entries' specs are read.
func Register(b *resource.Builder[*resource.Claim], g *Guest) {
	b.Add(logsResource{g}, g != nil)
	b.Add(cgroupResource{g}, g != nil && g.d.Leases != nil)
	b.Add(agentResource{g}, g != nil)
	b.Add(bundleResource{g}, g != nil)
	b.Add(runscResource{g}, g != nil && g.d.Runtime != nil)
}

// BundleDir is the OCI bundle dir of generation cid under the run dir.
func BundleDir(runDir, cid string) string { return filepath.Join(runDir, "bundles", cid) }

func (g *Guest) bundleDir(cid string) string { return BundleDir(g.cfg.RunDir, cid) }

// LeaseSpec is a generation's lease: its claim's resources, the boot CPU
// allowance, and pids.max with the runtime's allowance on top.
func LeaseSpec(cid string, r journal.Resources, bootCPU, runtimePIDs int64) lease.Spec {
	s := lease.Spec{ID: cid, CPUMillis: r.CPUMillis, MemoryBytes: r.MemoryBytes, PIDs: r.PIDs + runtimePIDs, Cpuset: r.Cpuset}
	if bootCPU > r.CPUMillis {
		s.BootCPUMillis = bootCPU
	}
	return s
}
