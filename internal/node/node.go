// Package node is the primary's authority over the sandboxes of one host:
// it turns claims into a lease, a RootFS, a netns and a runsc container,
// journals every effect before making it, publishes a generation only on a
// readiness proof, and returns capacity only with a signed cleanup proof.
// It works on domain types (the journal's records, proofs); the API serves
// it through apiserver.Adapter, which converts the wire types.
package node

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/logging"
	"github.com/ctld/ctld/internal/names"
	"github.com/ctld/ctld/internal/netpolicy"
	"github.com/ctld/ctld/internal/node/blockroot"
	"github.com/ctld/ctld/internal/node/guest"
	"github.com/ctld/ctld/internal/node/meter"
	"github.com/ctld/ctld/internal/node/network"
	"github.com/ctld/ctld/internal/node/op"
	"github.com/ctld/ctld/internal/node/overlay"
	"github.com/ctld/ctld/internal/node/pvolume"
	"github.com/ctld/ctld/internal/node/resource"
	"github.com/ctld/ctld/internal/node/warm"
	"github.com/ctld/ctld/internal/node/writers"
	"github.com/ctld/ctld/internal/proof"
)

// Config is the node's static configuration.
type Config struct {
	Slot         string
	StateDir     string // e.g. /var/lib/ctld
	RunDir       string // e.g. /run/ctld
	TemplatesDir string // a template named T is the directory TemplatesDir/T
	Reserve      Capacity
	Versions     Versions
	// DefaultArgs is the main process when a claim names none.
	DefaultArgs []string
	// GuestOOMScoreAdj is every guest's oom_score_adj (0..1000), set in
	// its OCI spec so guests never inherit ctld's protective value.
	GuestOOMScoreAdj int
	// WithheldRetry is the timer of withheld teardown retries and the
	// first backoff step (0: retry on takeover only); the backoff doubles
	// per attempt up to WithheldRetryMax.
	WithheldRetry    time.Duration
	WithheldRetryMax time.Duration
	// DefaultDiskBytes is the disk lease of a claim that names none.
	DefaultDiskBytes int64
	// DiskProjects is the project id range ctld owns on the scratch
	// filesystem (zero: DefaultDiskProjects).
	DiskProjects DiskProjects
	// NetLimits bound a network policy (rules, ports per rule); zero:
	// netpolicy's defaults.
	NetLimits netpolicy.Limits
	// Carriers is the size of the pool of warm network carriers
	// (carriers.go); 0: none, every claim makes its netns and veth.
	Carriers int
	// CarrierWait bounds how long a claim waits for a warm carrier being
	// made on the last free address block (0: DefaultCarrierWait).
	CarrierWait time.Duration
	// Block configures block-mode generations (block.go).
	Block BlockConfig
	// AgentBinary is the static ctl-agent every generation runs as its
	// init (agent.go); best on the run dir's filesystem, so each
	// generation's copy is a hard link. Empty: claims are refused.
	AgentBinary string
	// ReadyTimeout bounds the wait for a new guest's agent to answer the
	// readiness proof (0: DefaultReadyTimeout).
	ReadyTimeout time.Duration
	// BootCPUMillis is a new generation's cpu.max from its lease until its
	// readiness proof, when the claim asks for less (lease.Spec): the boot
	// is ctld's and runsc's work, not the workload's. 0: boots run inside
	// the claim's share.
	BootCPUMillis int64
	// RuntimePIDs is added to every new lease's pids.max on top of the
	// claim's PIDs, which are the workload's: the lease also holds the
	// runtime's own tasks (the sentry's and gofer's threads, ptrace's
	// stub threads), whose number rises on a slow node. It is recorded
	// with the generation (journal.Resources.RuntimePIDs) and counted in
	// the capacity ledger. 0: none.
	RuntimePIDs int64
	// AgentCallTimeout bounds an agent call that is not a stream (ready,
	// stat, list, mkdir, remove, rename; 0: the client's 10 s).
	AgentCallTimeout time.Duration
	// AgentStreamIdle bounds each wait of a file stream through an agent
	// (0: client.DefaultStreamIdle).
	AgentStreamIdle time.Duration
	// AgentListBytes bounds the bytes of one directory listing through an
	// agent (0: client.DefaultListBudget); ctld's MemoryMax is sized
	// from it (docs/operations.md).
	AgentListBytes int64
	// ExitPoll is the exit watch's fallback look at every ready
	// generation's lease (0: exitwatch.DefaultInterval; < 0: no watch, a
	// guest's end is found by the next takeover); cgroup.events
	// notifications wake it at once (exits.go).
	ExitPoll time.Duration
	// ExecTimeoutDefault is the timeout of an exec or session that names
	// none (0: none); ExecIdle ends a non-TTY exec or session after that
	// long with no output and no input (0: none). See agentcalls.go.
	ExecTimeoutDefault, ExecIdle time.Duration
	// UsageKeep > 0 bounds the usage records the journal keeps, read or
	// not (0: none); UsageRetention is how long an unacknowledged one
	// stays (0: meter.DefaultMaxAge). See meter.Retention.
	UsageKeep      int
	UsageRetention time.Duration
	// WarmPool sizes the warm pools per template (warmpool.go); no size
	// above 0: no pool, every claim is cold. Versions.Runsc is the
	// members' runsc build.
	WarmPool warm.Settings
	// WarmResources are a warm member's neutral limits until its claim
	// (zero: DefaultWarmResources; the disk lease DefaultDiskBytes).
	WarmResources journal.Resources
}

// DefaultCarrierWait is Config.CarrierWait's default: a carrier is made
// in milliseconds, seconds on a loaded host.
const DefaultCarrierWait = network.DefaultCarrierWait

// Deps are the subsystems the node drives; main builds them.
type Deps struct {
	Journal *journal.Journal
	// Answers encodes what finished operations store (answers.go).
	Answers  Answers
	Identity proof.Identity
	Epoch    uint64
	// The subsystems, one group per concern, each defined in its
	// concern's package and passed whole to it: a concern's new
	// dependency is a field there and its wiring in cmd/ctld. A missing
	// subsystem (nil) makes its entries absent and the claims that need
	// them refused (fail closed); see each group's doc.
	Guest   guest.Deps
	Overlay overlay.Deps
	Network network.Deps
	// Writers, Block and Volumes: block-mode roots and persistent
	// volumes; the writers' devices and sealer are shared by both.
	Writers writers.Deps
	Block   blockroot.Deps
	Volumes pvolume.Deps
	// ImageDefaults, when set, fills a claim's unset process from its
	// template image's config (imagedefaults.go).
	ImageDefaults TemplateDefaults
	Logger        *slog.Logger
	// Total is the host's capacity before the reserve (see HostCapacity).
	Total Capacity
	// Term is the primary's term: cancelled when it ends, after which the
	// node makes no kernel effect (see term.go). nil: never ends (tests).
	Term context.Context
	// Crash, when set, is called at each crash point ("cgroup:intended",
	// "cgroup:made", ...) so tests can kill the process there. nil in production.
	Crash func(point string)
}

// Node is the primary's authority over its sandboxes; the API serves it
// through apiserver.Adapter.
type Node struct {
	cfg Config
	d   Deps
	log *slog.Logger

	// term, ops, run and locks are the operation runner (internal/node/op).
	term  *op.Term
	ops   *op.Ops
	run   *op.Runner
	locks op.Locks // a sandbox's network updates and the start of its release

	mu     sync.Mutex
	timers map[string]*time.Timer // container id → max-lifetime release
	exits  exitWatch              // the ready generations' exit watch (exits.go)
	closed bool
	// unjournaled lists objects found and removed that no effect record
	// named: the second line of defence worked, the first did not.
	unjournaled []string
	// net is the sandbox network: its entries, slots, policies and warm
	// carriers (internal/node/network).
	net *network.Net

	// table is the generation's resources in claim order (resources.go).
	table *resource.Table[*resource.Claim]

	// guest and overlay are the concerns (internal/node/guest, overlay).
	guest   *guest.Guest
	overlay *overlay.Overlay
	meter   *meter.Meter // usage metering (usage.go)
	warm    warmPool     // the warm pool's filler and counts (warmpool.go)
}

// New wires a node. Call Reconcile before serving.
func New(cfg Config, d Deps) *Node {
	d.Logger = logging.OrDiscard(d.Logger)
	if cfg.WithheldRetryMax <= 0 {
		cfg.WithheldRetryMax = DefaultWithheldRetryMax
	}
	if len(cfg.DefaultArgs) == 0 {
		cfg.DefaultArgs = []string{"/bin/sleep", "2147483647"}
	}
	n := &Node{
		cfg:    cfg,
		d:      d,
		log:    d.Logger.With("epoch", d.Epoch),
		timers: map[string]*time.Timer{},
		term:   op.NewTerm(d.Term),
	}
	n.ops = op.NewOps(d.Journal, n.log)
	n.run = &op.Runner{J: d.Journal, Epoch: d.Epoch, Term: n.term, CrashHook: d.Crash}
	// The address pool is capacity like CPU: its blocks are counted in
	// the ledger (GET /v1/node), slots are handed out by Pool.Alloc.
	if pool := d.Network.Pool; pool.V4.IsValid() && d.Total.Addresses == 0 {
		n.d.Total.Addresses = int64(pool.Len())
	}
	n.guest = n.newGuest()
	n.overlay = overlay.New(overlay.Config{DefaultDiskBytes: cfg.DefaultDiskBytes, DiskProjects: cfg.DiskProjects}, d.Overlay)
	n.net = network.New(network.Wiring{
		Deps: d.Network, Log: n.log, Term: n.term, Run: n.run, Locks: &n.locks, Limits: cfg.NetLimits, Carriers: cfg.Carriers, CarrierWait: cfg.CarrierWait,
		Identities: identities{n}, Ready: n.ready,
	})
	n.table = newTable(n)
	n.meter = n.newMeter()
	return n
}

// newGuest is the guest concern over the node's config and deps.
func (n *Node) newGuest() *guest.Guest {
	c := n.cfg
	return guest.New(guest.Config{
		RunDir: c.RunDir, DefaultArgs: c.DefaultArgs, GuestOOMScoreAdj: c.GuestOOMScoreAdj, AgentBinary: c.AgentBinary,
		ReadyTimeout: c.ReadyTimeout, BootCPUMillis: c.BootCPUMillis, AgentCallTimeout: c.AgentCallTimeout,
		AgentStreamIdle: c.AgentStreamIdle, AgentListBytes: c.AgentListBytes, ExecTimeoutDefault: c.ExecTimeoutDefault, ExecIdle: c.ExecIdle,
	}, guest.Wiring{
		Deps: n.d.Guest, Nameservers: guest.NameserversFunc(n.guestNameservers), Begin: n.begin, Live: n.live, Sandbox: n.sandbox, Log: n.log,
	})
}

// unjournaledFound notes and logs an object that exists although no effect
// record names it: the journal should have said so before it was made.
func (n *Node) unjournaledFound(kind journal.Kind, name, where string) {
	n.log.Warn("removing an object the journal has no record of", "kind", kind, "name", name, "found_by", where)
	n.mu.Lock()
	n.unjournaled = append(n.unjournaled, string(kind)+"/"+name)
	n.mu.Unlock()
}

// Unjournaled lists the objects (kind/name) this node found and removed
// although no effect record named them (orphan sweep, proof checks). Empty
// while the journal is the whole truth: tests assert it.
func (n *Node) Unjournaled() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.unjournaled)
}

func (n *Node) crash(point string) { n.run.Crash(point) }

// names of a generation's kernel objects, all derived from validated ids.
func containerID(id string, gen uint64) string { return names.Generation(id, gen) }

func (n *Node) bundleDir(cid string) string { return guest.BundleDir(n.cfg.RunDir, cid) }

func newNonce() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("read random nonce: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// Versions of the kernel pieces the node depends on.
type Versions struct {
	Ctld, Kernel, Runsc, Nft string
}

// Info is the node as it stands: its identity, term and capacity ledger.
type Info struct {
	NodeID, BootID, Slot string
	Epoch                uint64
	// NodeKey is the public key that signs the node's cleanup proofs
	// (nil: the node has no key); Rotation, while the node rotates its
	// key, moves a verifier's pinned key to it.
	NodeKey  []byte
	Rotation *proof.Rotation
	Versions Versions
	Capacity Ledger
	// Withheld are the generations whose cleanup is unproven.
	Withheld []Withheld
	// WarmPools is each configured warm pool's state by template (WarmPools).
	WarmPools map[string]warm.Stats
}

// Node is the node's identity, term and capacity ledger.
func (n *Node) Node(ctx context.Context) (Info, error) {
	out := Info{
		NodeID:   n.d.Identity.NodeID,
		BootID:   n.d.Identity.BootID,
		Slot:     n.cfg.Slot,
		Epoch:    n.d.Epoch,
		Versions: n.cfg.Versions,
	}
	if n.d.Identity.Key != nil {
		out.NodeKey = n.d.Identity.PublicKey()
		out.Rotation = n.d.Identity.Rotation
	}
	err := n.d.Journal.View(func(tx *journal.Tx) error {
		ss, err := tx.LiveSandboxes()
		if err != nil {
			return err
		}
		ms, err := tx.WarmMembers()
		if err != nil {
			return err
		}
		out.Capacity = ledger(n.d.Total, n.cfg.Reserve, ss, ms)
		out.WarmPools = n.warmPoolsOf(ms)
		for _, s := range ss {
			if s.Withheld {
				out.Withheld = append(out.Withheld, withheldLease(tx, s))
			}
		}
		return nil
	})
	if err != nil {
		return Info{}, errdefs.Errorf(errdefs.CodeInternal, "read journal: %v", err)
	}
	return out, nil
}

// SandboxView is a sandbox's record with what the kernel says of it now.
type SandboxView struct {
	journal.Sandbox
	// Network is the generation's network mode and packet counters (nil:
	// no sandbox network).
	Network *NetworkStatus
	// Usage is the generation's usage totals (nil: none known).
	Usage *journal.Usage
}

// NetworkStatus is a generation's network as the node enforces it: its
// mode and its nft chain's counters (zero unless it runs).
type NetworkStatus = network.Status

// List is every sandbox the journal knows, as the kernel has it now.
func (n *Node) List(ctx context.Context) ([]SandboxView, error) {
	var ss []journal.Sandbox
	err := n.d.Journal.View(func(tx *journal.Tx) (err error) {
		ss, err = tx.Sandboxes()
		return err
	})
	if err != nil {
		return nil, errdefs.Errorf(errdefs.CodeInternal, "read journal: %v", err)
	}
	// Live facts outside the read transaction: view opens its own (usage),
	// and one nested in another waits behind a commit that remaps the
	// file, which waits for the outer one (TestListWhileJournalGrows).
	out := make([]SandboxView, 0, len(ss))
	for _, s := range ss {
		out = append(out, n.view(ctx, s))
	}
	return out, nil
}

// Get is sandbox id as the kernel has it now (not_found: the journal
// never saw it).
func (n *Node) Get(ctx context.Context, id string) (SandboxView, error) {
	s, err := n.sandbox(id)
	if err != nil {
		return SandboxView{}, err
	}
	return n.view(ctx, s), nil
}

// view adds live facts (OOM kills, network counters) to a sandbox's
// record.
func (n *Node) view(ctx context.Context, s journal.Sandbox) SandboxView {
	out := SandboxView{Sandbox: s, Network: n.net.Status(ctx, s), Usage: n.liveUsage(ctx, s)}
	if s.State == journal.StateReady {
		if st, err := n.d.Guest.Leases.Stats(ctx, s.LeaseID); err == nil {
			out.OOMKills = st.OOMKills
		}
	}
	return out
}

func (n *Node) sandbox(id string) (journal.Sandbox, error) { return op.Sandbox(n.d.Journal, id) }

// Proof is the signed cleanup proof stored under operation opID.
func (n *Node) Proof(ctx context.Context, opID string) (proof.Proof, error) {
	var p proof.Proof
	var ok bool
	err := n.d.Journal.View(func(tx *journal.Tx) (err error) {
		p, ok, err = tx.Proof(opID)
		return err
	})
	if err != nil {
		return proof.Proof{}, errdefs.Errorf(errdefs.CodeInternal, "read journal: %v", err)
	}
	if !ok {
		return proof.Proof{}, errdefs.Errorf(errdefs.CodeNotFound, "no cleanup proof for operation %q", opID)
	}
	return p, nil
}
