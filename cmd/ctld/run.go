package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/ctld/ctld/internal/agent/client"
	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/apiserver"
	"github.com/ctld/ctld/internal/guestlog"
	"github.com/ctld/ctld/internal/ha"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/lease"
	"github.com/ctld/ctld/internal/logging"
	"github.com/ctld/ctld/internal/metrics"
	"github.com/ctld/ctld/internal/netpolicy"
	"github.com/ctld/ctld/internal/node"
	"github.com/ctld/ctld/internal/node/guest"
	"github.com/ctld/ctld/internal/node/meter"
	"github.com/ctld/ctld/internal/node/overlay"
	"github.com/ctld/ctld/internal/proof"
	"github.com/ctld/ctld/internal/rootfs"
	"github.com/ctld/ctld/internal/runsc"
	"github.com/ctld/ctld/internal/template"
	"github.com/ctld/ctld/internal/writer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
)

type runOpts struct {
	slot         string
	group        string
	cgroupRoot   string
	cgroupParent string
	runsc        string
	reserveCPU   int64
	reserveMem   int64
	reservePIDs  int64
	reserveDisk  int64
	defaultDisk  int64
	diskProjBase uint32
	busybox      string
	guestOOMAdj  int

	// runscPlatform is runsc's --platform ("": the binary's default).
	runscPlatform string
	// agentBinary is the static ctl-agent every guest runs as its init.
	agentBinary string
	// agentStreamIdle bounds each wait of a file stream on a guest agent.
	agentStreamIdle time.Duration
	// agentListBytes bounds one directory listing through a guest agent.
	agentListBytes int64
	// readyTimeout bounds a new guest's readiness proof; bootCPU is its
	// CPU allowance until then (node.Config).
	readyTimeout time.Duration
	bootCPU      int64
	// runtimePIDs is each lease's pids.max on top of its claim's PIDs.
	runtimePIDs int64
	// warm is the warm pool's sizes and bounds (--warm-pool*).
	warm warmOpts
	// Bounds on concurrent work and on the journal's history.
	maxClaims, maxExecs int
	retention           journal.Retention
	// Per-sandbox and stream bounds, and the node's exec bounds (issue 21).
	maxSandboxExecs, maxStreams, maxSandboxStreams int
	execTimeoutDefault, execIdle                   time.Duration
	logMax                                         int64
	// journalTimeout bounds the wait for the journal's flock on takeover.
	journalTimeout time.Duration
	// takeoverLimit bounds a takeover (journal, reconcile) before the
	// watchdog stops being pinged.
	takeoverLimit time.Duration
	// drainTimeout bounds the wait for in-flight work after the term.
	drainTimeout time.Duration
	// maxFileBytes caps a file streamed through the API's files routes.
	maxFileBytes int64
	// Withheld teardown retries: timer and first backoff step, and cap.
	withheldRetry    time.Duration
	withheldRetryMax time.Duration
	usageInterval    time.Duration // usage metering (node/usage.go)
	usageKeep        int
	usageRetention   time.Duration
	// The sandbox network (network.go).
	net netOpts
	// Block-mode RootFS (block.go).
	block blockOpts
	// --log-level, --log-format.
	log logging.Flags
	// metricsListen are --metrics-listen's [SLOT=]HOST:PORT entries.
	metricsListen []string
}

func runCmd(g *globalOpts) *cobra.Command {
	var o runOpts
	c := &cobra.Command{
		Use:   "run --slot a|b",
		Short: "run one instance of the A/B pair (standby until it holds the primary lock)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.slot != "a" && o.slot != "b" {
				return usagef("--slot must be a or b, got %q", o.slot)
			}
			if o.bootCPU != 0 && (o.bootCPU < lease.MinCPUMillis || o.bootCPU > lease.MaxCPUMillis) {
				return usagef("--boot-cpu-millis must be 0 or between %d and %d, got %d", lease.MinCPUMillis, lease.MaxCPUMillis, o.bootCPU)
			}
			if o.agentListBytes < 1<<20 {
				return usagef("--max-list-bytes must be at least 1 MiB, got %d", o.agentListBytes)
			}
			if o.runtimePIDs < 0 || o.runtimePIDs > node.MaxRuntimePIDs {
				return usagef("--runtime-pids must be between 0 and %d, got %d", node.MaxRuntimePIDs, o.runtimePIDs)
			}
			if o.readyTimeout <= 0 {
				return usagef("--ready-timeout must be positive, got %v", o.readyTimeout)
			}
			if o.guestOOMAdj < 0 || o.guestOOMAdj > 1000 {
				return usagef("--guest-oom-score-adj must be between 0 and 1000, got %d", o.guestOOMAdj)
			}
			if err := validPlatform(o.runscPlatform); err != nil {
				return usagef("--runsc-platform: %v", err)
			}
			if o.usageRetention <= 0 || o.usageKeep < 0 {
				return usagef("--usage-retention must be positive and --usage-records at least 0, got %v and %d", o.usageRetention, o.usageKeep)
			}
			if o.maxClaims < 1 || o.maxExecs < 1 {
				return usagef("--max-concurrent-claims and --max-concurrent-execs must be at least 1, got %d and %d", o.maxClaims, o.maxExecs)
			}
			if o.maxSandboxExecs < 1 || o.maxStreams < 1 || o.maxSandboxStreams < 1 {
				return usagef("--max-execs-per-sandbox, --max-concurrent-streams and --max-streams-per-sandbox must be at least 1, got %d, %d and %d",
					o.maxSandboxExecs, o.maxStreams, o.maxSandboxStreams)
			}
			if o.execTimeoutDefault < time.Second || o.execIdle < time.Second {
				return usagef("--exec-timeout-default and --exec-idle-timeout must be at least 1s, got %v and %v", o.execTimeoutDefault, o.execIdle)
			}
			if o.maxFileBytes < 1 {
				return usagef("--max-file-bytes must be at least 1, got %d", o.maxFileBytes)
			}
			if o.retention.MaxAge < time.Minute || o.retention.MaxRecords < 1000 {
				return usagef("--journal-retention must be at least 1m and --journal-retention-records at least 1000, got %v and %d",
					o.retention.MaxAge, o.retention.MaxRecords)
			}
			if err := guestlog.ValidMax(o.logMax); err != nil {
				return usagef("--log-max-bytes: %w", err)
			}
			if o.defaultDisk < api.MinDiskBytes || o.defaultDisk > api.MaxDiskBytes {
				return usagef("--default-disk-bytes must be between %d and %d, got %d", int64(api.MinDiskBytes), int64(api.MaxDiskBytes), o.defaultDisk)
			}
			if o.diskProjBase == 0 || o.diskProjBase > ^uint32(0)-node.DefaultDiskProjects.Count {
				return usagef("--disk-project-base must be between 1 and %d, got %d", ^uint32(0)-node.DefaultDiskProjects.Count, o.diskProjBase)
			}
			if err := o.net.check(); err != nil {
				return usagef("%w", err)
			}
			if err := o.block.check(); err != nil {
				return usagef("%w", err)
			}
			if err := o.warm.check(); err != nil {
				return usagef("%w", err)
			}
			if _, err := metrics.ListenAddr(o.metricsListen, o.slot); err != nil {
				return usagef("%w", err)
			}
			log, err := newLogger(cmd.ErrOrStderr(), o.log, o.slot)
			if err != nil {
				return usagef("%w", err)
			}
			if o.agentBinary == "" {
				o.agentBinary = defaultAgentBinary()
			}
			if err := checkAgentBinary(o.agentBinary); err != nil {
				return usagef("--agent-binary: %w", err)
			}
			if os.Geteuid() != 0 {
				return errNotRoot
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			return runInstance(ctx, *g, o, log)
		},
	}
	f := c.Flags()
	f.StringVar(&o.slot, "slot", "", "instance slot: a or b")
	f.StringVar(&o.group, "group", "ctld", "group allowed on the API socket (besides root)")
	f.StringVar(&o.cgroupRoot, "cgroup-root", lease.DefaultRoot, "cgroup v2 mount point")
	f.StringVar(&o.cgroupParent, "cgroup-parent", lease.DefaultParent, "ctld-owned parent cgroup of the leases")
	runscFlags(f, &o.runsc, &o.runscPlatform)
	f.Int64Var(&o.reserveCPU, "reserve-cpu-millis", 250, "CPU kept back from sandboxes for the host")
	f.Int64Var(&o.reserveMem, "reserve-memory-bytes", 512<<20, "memory kept back from sandboxes for the host")
	f.Int64Var(&o.reservePIDs, "reserve-pids", 4096, "PIDs kept back from sandboxes for the host")
	f.IntVar(&o.guestOOMAdj, "guest-oom-score-adj", runsc.DefaultGuestOOMScoreAdj, "oom_score_adj of every guest's runsc processes (0-1000; ctld's own is its unit's OOMScoreAdjust)")
	f.Int64Var(&o.reserveDisk, "reserve-disk-bytes", 1<<30, "scratch filesystem space kept back from disk leases (journal, templates, host)")
	f.Int64Var(&o.defaultDisk, "default-disk-bytes", 1<<30, "disk lease of a claim that names no resources.disk_bytes")
	f.Uint32Var(&o.diskProjBase, "disk-project-base", node.DefaultDiskProjects.Base, "first of the project ids ctld owns on the scratch filesystem (it owns 2^20)")
	f.StringVar(&o.agentBinary, "agent-binary", "", "the static ctl-agent every guest runs as its init (default: ctl-agent beside the ctld executable)")
	f.Int64Var(&o.agentListBytes, "max-list-bytes", client.DefaultListBudget, "bytes one directory listing through a guest agent may cost (names, link targets and 128 per entry); past it the listing fails as too large (ctld's MemoryMax is sized from it)")
	f.DurationVar(&o.agentStreamIdle, "agent-stream-idle", client.DefaultStreamIdle, "how long a file read or write through a guest agent may stall (no next frame, no intake, no answer once sent) before it fails")
	f.DurationVar(&o.readyTimeout, "ready-timeout", node.DefaultReadyTimeout, "how long a new guest's agent has to answer the readiness proof after runsc start before the claim is rolled back")
	warmFlags(f, &o.warm)
	f.Int64Var(&o.runtimePIDs, "runtime-pids", node.DefaultRuntimePIDs, "tasks each lease's pids.max allows on top of its claim's PIDs, for the runtime's own threads (gVisor's sentry and gofer, ptrace's stubs); counted in the node's PIDs capacity")
	f.Int64Var(&o.bootCPU, "boot-cpu-millis", 1000, "a new guest's CPU limit (cpu.max) from its lease until its readiness proof, when its claim asks for less: runsc's boot is not the workload's (0: boot inside the claim's share)")
	f.StringVar(&o.busybox, "busybox", "/bin/busybox", "static busybox for the built-in \"busybox\" template (empty: none)")
	f.IntVar(&o.maxClaims, "max-concurrent-claims", 8, "claims running at once; beyond it a claim is answered unavailable with a retry hint")
	f.IntVar(&o.maxExecs, "max-concurrent-execs", 32, "execs running at once; beyond it an exec is answered unavailable with a retry hint")
	f.IntVar(&o.maxSandboxExecs, "max-execs-per-sandbox", 8, "execs and sessions running at once in one sandbox; beyond it unavailable with a retry hint")
	f.IntVar(&o.maxStreams, "max-concurrent-streams", 32, "log follows, file reads and writes and directory listings open at once on the node; beyond it unavailable with a retry hint")
	f.IntVar(&o.maxSandboxStreams, "max-streams-per-sandbox", 8, "log follows, file reads and writes and directory listings open at once per sandbox; beyond it unavailable with a retry hint")
	f.DurationVar(&o.execTimeoutDefault, "exec-timeout-default", time.Hour, "timeout of an exec or session that gives none (timeout_sec 0)")
	f.DurationVar(&o.execIdle, "exec-idle-timeout", 10*time.Minute, "a non-TTY exec or session with no output and no input for this long is ended")
	f.Int64Var(&o.maxFileBytes, "max-file-bytes", apiserver.DefaultMaxStreamFileBytes, "largest file the API reads or writes in a sandbox (streamed, never held whole)")
	f.DurationVar(&o.retention.MaxAge, "journal-retention", 24*time.Hour,
		"how long finished generations, operation results and cleanup proofs stay in the journal: the idempotency window of an operation_id")
	f.IntVar(&o.retention.MaxRecords, "journal-retention-records", 200000,
		"at most this many finished records (about 4 per generation) stay in the journal; the oldest go first, even inside --journal-retention")
	f.Int64Var(&o.logMax, "log-max-bytes", 1<<20, "cap of each log of a generation (the guest's output, runsc's log), in RAM on the run dir's tmpfs, charged to the sandbox's memory")
	f.DurationVar(&o.journalTimeout, "journal-timeout", 5*time.Second, "on takeover, how long to wait for the journal's lock before giving the primary role up")
	f.DurationVar(&o.takeoverLimit, "takeover-limit", 5*time.Minute, "longest takeover (journal, reconcile) before the watchdog stops being pinged")
	f.DurationVar(&o.drainTimeout, "drain-timeout", time.Minute, "after the term ends, how long to wait for cancelled work before exiting with the lock held")
	f.DurationVar(&o.withheldRetry, "withheld-retry", node.DefaultWithheldRetry, "retry the teardown of withheld generations this often, backing off per attempt (0: only on takeover)")
	f.DurationVar(&o.withheldRetryMax, "withheld-retry-max", node.DefaultWithheldRetryMax, "longest wait between two retries of one withheld generation")
	f.DurationVar(&o.usageInterval, "usage-interval", time.Minute, "journal a usage record of every ready generation this often (GET /v1/usage; 0: off; a generation's final record is written at its end either way)")
	f.DurationVar(&o.usageRetention, "usage-retention", meter.DefaultMaxAge, "a usage record the manager has not acknowledged stays this long; acknowledged ones go at once (docs/operations.md, Usage metering)")
	f.IntVar(&o.usageKeep, "usage-records", 0, "if above 0, at most this many usage records stay in the journal, read or not: a disk bound that drops unread ones (the manager's puller logs the gap); 0: none")
	f.StringSliceVar(&o.metricsListen, "metrics-listen", nil, "also serve /metrics (not pprof) over TCP at HOST:PORT; SLOT=HOST:PORT for one slot only, as both instances of a pair need their own port (repeatable; the root-only debug socket <run-dir>/debug-SLOT.sock always serves /metrics and pprof)")
	o.net.flags(f)
	o.block.flags(f)
	o.log.Register(f)
	return c
}

// instance is one ctld process's view of its role, for the probe socket.
type instance struct {
	mu     sync.Mutex
	status ha.Status
}

func (i *instance) get() ha.Status {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.status
}

func (i *instance) set(f func(*ha.Status)) {
	i.mu.Lock()
	defer i.mu.Unlock()
	f(&i.status)
}

func groupID(name string, log *slog.Logger) int {
	if name == "" {
		return -1
	}
	gr, err := user.LookupGroup(name)
	if err != nil {
		log.Warn("API socket group not found: only root may use the API", "group", name, "err", err)
		return -1
	}
	gid, _ := strconv.Atoi(gr.Gid)
	return gid
}

// runInstance is `ctld run`: standby until it holds the primary lock, then
// a primary term, until ctx ends.
func runInstance(ctx context.Context, g globalOpts, o runOpts, log *slog.Logger) error {
	for _, d := range []string{g.stateDir, g.runDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("make dir %s: %w", d, err)
		}
	}
	if err := o.block.probeStore(ctx, g.stateDir); err != nil {
		return err
	}
	gid := groupID(o.group, log)
	inst := &instance{status: ha.Status{Slot: o.slot, Role: ha.RoleStandby, Health: "ok", PID: os.Getpid(), Since: time.Now().UTC()}}
	// The debug socket first: an instance that answers its probe serves
	// its metrics too (a scraper that saw it standby found no socket).
	m := metrics.New(prometheus.NewRegistry(), inst.get)
	if err := serveDebug(ctx, g.runDir, o, m, log); err != nil {
		return err
	}
	probeSock := probePath(g.runDir, o.slot)
	probeLn, err := ha.ListenUnix(probeSock, 0o660, gid)
	if err != nil {
		return fmt.Errorf("listen probe socket: %w", err)
	}
	go func() {
		if err := ha.ServeProbe(ctx, probeLn, inst.get, log); err != nil && ctx.Err() == nil {
			log.Error("probe socket stopped", "err", err)
		}
	}()
	mon := newMonitor(log, func(h string) { inst.set(func(s *ha.Status) { s.Health = h }) })
	mon.set(healthCheck{"probe", func(ctx context.Context) error { _, err := ha.Probe(ctx, probeSock); return err }})
	_, _ = daemon.SdNotify(false, daemon.SdNotifyReady)
	go mon.run(ctx)
	log.Info("standby: waiting for the primary lock", "lock", ha.LockPath(g.stateDir))

	// Read-only host facts are gathered while standby, so a takeover does
	// not pay for them (runsc --version alone is a process start).
	facts, err := gatherFacts(ctx, g, o)
	if err != nil {
		return err
	}
	el := &ha.Elector{StateDir: g.stateDir, Slot: o.slot, Logger: log}
	term, err := el.WaitPrimary(ctx)
	if err != nil {
		if ctx.Err() != nil {
			log.Info("standby stopped")
			return nil
		}
		return fmt.Errorf("wait for primary lock: %w", err)
	}
	return runPrimary(ctx, g, o, facts, term, inst, mon, m, gid, log.With("epoch", term.Epoch))
}

// debugPath is the root-only socket of an instance's metrics and pprof.
func debugPath(runDir, slot string) string {
	return filepath.Join(runDir, "debug-"+slot+".sock")
}

// serveDebug serves m for the whole process, standby or primary: /metrics
// and pprof on the root-only debug socket, and /metrics alone on the TCP
// address --metrics-listen gives this slot, if any.
func serveDebug(ctx context.Context, runDir string, o runOpts, m *metrics.Metrics, log *slog.Logger) error {
	addr, err := metrics.ListenAddr(o.metricsListen, o.slot)
	if err != nil {
		return err
	}
	ln, err := ha.ListenUnix(debugPath(runDir, o.slot), 0o600, -1)
	if err != nil {
		return fmt.Errorf("listen debug socket: %w", err)
	}
	serve := func(ln net.Listener, h http.Handler) {
		if err := metrics.Serve(ctx, ln, h, log); err != nil && ctx.Err() == nil {
			log.Error("metrics server stopped", "addr", ln.Addr().String(), "err", err)
		}
	}
	go serve(ln, m.Handler(log, true))
	if addr != "" {
		tln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listen --metrics-listen %s: %w", addr, err)
		}
		go serve(tln, m.Handler(log, false))
		log.Info("serving metrics over TCP", "addr", tln.Addr().String())
	}
	return nil
}

// runPrimary is one term. In order: the lock is held and the epoch bumped
// (WaitPrimary); the journal is opened (bounded wait for its flock) and
// taken over at the term's epoch; the node is built and reconciled; the API
// listens; only then does the probe say primary. A failure before that gives
// the role and the lock back without ever saying primary. When the term ends
// (SIGTERM, the lock or the journal lost) in-flight work is cancelled and
// waited for, the journal closed, and only then is the lock released.
func runPrimary(ctx context.Context, g globalOpts, o runOpts, facts hostFacts, term *ha.Term, inst *instance, mon *monitor, m *metrics.Metrics, gid int, log *slog.Logger) (err error) {
	took := time.Now()
	termCtx, endTerm := context.WithCancelCause(ctx)
	defer endTerm(nil)
	inst.set(func(s *ha.Status) {
		s.Role, s.Epoch, s.Since, s.Health = ha.RoleStarting, term.Epoch, time.Now().UTC(), "starting"
	})
	// The takeover has its own bound: a reconcile that hangs stops the
	// watchdog pings and systemd restarts the instance.
	mon.set(healthCheck{"takeover", func(context.Context) error {
		if d := time.Since(took); d > o.takeoverLimit {
			return fmt.Errorf("taking over for %v (limit %v)", d.Round(time.Second), o.takeoverLimit)
		}
		return nil
	}})
	log.Info("took the primary lock: taking over")
	_, _ = daemon.SdNotify(false, fmt.Sprintf("STATUS=taking over, epoch %d", term.Epoch))
	giveUp := func(err error) error {
		inst.set(func(s *ha.Status) { s.Role, s.Health = ha.RoleStandby, "failed: "+err.Error() })
		log.Error("giving up the primary role", "err", err)
		return errors.Join(err, term.Release())
	}

	j, err := journal.Open(filepath.Join(g.stateDir, "journal.db"), o.journalTimeout)
	if err != nil {
		return giveUp(err)
	}
	if err := j.TakeOver(term.Epoch); err != nil {
		return giveUp(errors.Join(err, j.Close()))
	}
	j.OnCommit(m.ObserveCommit)
	sn, err := buildNet(o.net, m, log)
	if err != nil {
		return giveUp(errors.Join(err, j.Close()))
	}
	n, err := buildNode(termCtx, g, o, facts, term.Epoch, j, sn, log)
	if err != nil {
		return giveUp(errors.Join(err, j.Close()))
	}
	// The DNS proxy serves for the term from now on (it binds as soon as
	// a previous primary let the port go); Reconcile registers every
	// ready generation first thing. It stops with the term, before the
	// lock is given back.
	proxyDone := make(chan struct{})
	if sn.proxy != nil {
		go func() {
			defer close(proxyDone)
			if err := sn.proxy.Serve(termCtx); err != nil {
				log.Error("DNS proxy stopped", "err", err)
			}
		}()
	} else {
		close(proxyDone)
	}
	// From here on the node may make kernel effects: the term ends with a
	// drain before the journal is closed and the lock released.
	defer func() {
		inst.set(func(s *ha.Status) { s.Role, s.Health = ha.RoleStopping, "draining" })
		mon.set()
		endTerm(nil)
		derr := n.Drain(o.drainTimeout)
		if derr == nil {
			select {
			case <-proxyDone:
			case <-time.After(o.drainTimeout):
				derr = errors.New("DNS proxy still answering")
			}
		}
		if derr != nil {
			// Work may still be running: keep the journal and the lock,
			// and let the process exit (the kernel drops both).
			err = errors.Join(err, fmt.Errorf("drain: %w; exiting with the lock held", derr))
			return
		}
		err = errors.Join(err, j.Close())
		inst.set(func(s *ha.Status) { s.Role, s.Health = ha.RoleStandby, "stopped" })
		err = errors.Join(err, term.Release())
	}()
	built := time.Now()
	rerr := n.Reconcile(termCtx)
	log.Info("primary: reconciled", "build_ms", built.Sub(took).Milliseconds(), "reconcile_ms", time.Since(built).Milliseconds())
	if rerr != nil {
		// What could not be cleaned stays journaled and its capacity
		// withheld; serving the rest is better than a node that is down.
		log.Error("reconcile incomplete", "err", rerr)
	}
	// Withheld teardowns are retried on a timer for the whole term; each
	// attempt is an operation of the term, so the drain waits for it.
	go n.RetryWithheld(termCtx)
	// A block generation's writer that dies is restarted on its device
	// within the dead-connection timeout (node.WatchWriters).
	go n.WatchWriters(termCtx)
	if termCtx.Err() != nil {
		log.Info("term ended during takeover", "cause", context.Cause(termCtx))
		return nil
	}
	apiSock := apiSocketPath(g.runDir)
	apiLn, err := ha.ListenUnix(apiSock, 0o660, gid)
	if err != nil {
		return fmt.Errorf("listen API socket: %w", err)
	}
	mon.set(primaryChecks(term, j, apiSock, filepath.Join(o.cgroupRoot, o.cgroupParent), endTerm)...)
	inst.set(func(s *ha.Status) { s.Role, s.Health, s.Since = ha.RolePrimary, "ok", time.Now().UTC() })
	_, _ = daemon.SdNotify(false, fmt.Sprintf("STATUS=primary, epoch %d", term.Epoch))
	m.ObserveTakeover(time.Since(took))
	log.Info("primary: serving the API", "socket", apiLn.Addr().String(), "takeover_ms", time.Since(took).Milliseconds())
	svc := apiserver.Adapter{N: n}
	removeNode, err := m.ServeNode(svc, j)
	if err != nil {
		return errors.Join(err, apiLn.Close())
	}
	defer removeNode()
	removeWriters, err := m.ServeWriters(writerCounts{&writer.Supervisor{Root: filepath.Join(g.stateDir, "writers"), Logger: log}})
	if err != nil {
		return errors.Join(err, apiLn.Close())
	}
	defer removeWriters()
	go n.KeepHistory(termCtx, o.retention, 10*time.Minute)
	go n.MeterUsage(termCtx, o.usageInterval)
	// Files stream through the guest agent (node.ReadFileTo, WriteFileFrom).
	srv := &apiserver.Server{
		Service: metrics.Service{Service: svc, M: m}, Observer: m, Logger: log, AllowedGID: gid, MaxStreamFileBytes: o.maxFileBytes,
		Claims:         apiserver.NewLimiter("claims", "--max-concurrent-claims", o.maxClaims, 5*time.Second),
		Execs:          apiserver.NewLimiter("execs", "--max-concurrent-execs", o.maxExecs, time.Second),
		SandboxExecs:   apiserver.NewKeyedLimiter("execs", "--max-execs-per-sandbox", o.maxSandboxExecs, time.Second),
		Streams:        apiserver.NewLimiter("streams", "--max-concurrent-streams", o.maxStreams, 5*time.Second),
		SandboxStreams: apiserver.NewKeyedLimiter("streams", "--max-streams-per-sandbox", o.maxSandboxStreams, 5*time.Second),
		Usage:          svc,
	}
	err = srv.Serve(termCtx, apiLn)
	cause := context.Cause(termCtx)
	log.Info("primary: term over, handing over", "cause", cause, "err", err)
	if errors.Is(cause, errTermLost) {
		err = errors.Join(err, cause)
	}
	return err
}

// apiAnswers asks the API socket for GET /v1/node, as a client would.
func apiAnswers(ctx context.Context, sock string) error {
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
		DisableKeepAlives: true,
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://ctld/v1/node", nil)
	if err != nil {
		return err
	}
	req.Header.Set(api.HealthCheckHeader, "1")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /v1/node: %s", resp.Status)
	}
	return nil
}

// errTermLost ends a term whose lock or journal now belongs to someone else.
var errTermLost = errors.New("primary term lost")

// primaryChecks are what a primary must be able to do to serve: hold its
// lock, write the journal at its epoch, answer on the API socket, reach the
// kernel (its lease parent cgroup). A lost lock or a fenced journal ends the
// term at once; any failure stops the watchdog pings.
func primaryChecks(term *ha.Term, j *journal.Journal, apiSock, leaseParent string, endTerm context.CancelCauseFunc) []healthCheck {
	return []healthCheck{
		{"lock", func(context.Context) error {
			err := term.Held()
			if err != nil {
				endTerm(fmt.Errorf("%w: %w", errTermLost, err))
			}
			return err
		}},
		{"journal", func(context.Context) error {
			err := j.Heartbeat(time.Now())
			if errors.Is(err, journal.ErrFenced) {
				endTerm(fmt.Errorf("%w: %w", errTermLost, err))
			}
			return err
		}},
		{"api", func(ctx context.Context) error { return apiAnswers(ctx, apiSock) }},
		{"kernel", func(context.Context) error {
			_, err := os.ReadFile(filepath.Join(leaseParent, "cgroup.controllers"))
			return err
		}},
	}
}

// hostFacts are read-only facts about the host, gathered before primacy.
type hostFacts struct {
	total    node.Capacity
	versions node.Versions
}

func gatherFacts(ctx context.Context, g globalOpts, o runOpts) (hostFacts, error) {
	// Disk leases are counted against the scratch filesystem (<state>/scratch,
	// which may be a mount of its own).
	scratch := filepath.Join(g.stateDir, "scratch")
	if err := os.MkdirAll(scratch, 0o700); err != nil {
		return hostFacts{}, fmt.Errorf("make dir %s: %w", scratch, err)
	}
	total, err := node.HostCapacity(scratch)
	if err != nil {
		return hostFacts{}, err
	}
	f := hostFacts{total: total, versions: node.Versions{Ctld: version, Kernel: kernelRelease()}}
	if v, err := runsc.Version(ctx, o.runsc); err == nil {
		f.versions.Runsc = v
	}
	return f, nil
}

// buildNode wires the subsystems of a primary: main is the only place
// that builds them. term is the term's context: the node stops making
// kernel effects when it ends.
func buildNode(term context.Context, g globalOpts, o runOpts, facts hostFacts, epoch uint64, j *journal.Journal, sn sandboxNet, log *slog.Logger) (*node.Node, error) {
	ident, err := proof.LoadOrCreateIdentity(g.stateDir)
	if err != nil {
		return nil, fmt.Errorf("load node identity: %w", err)
	}
	leases := &lease.Manager{Root: o.cgroupRoot, Parent: o.cgroupParent, Logger: log}
	if err := leases.Init(term); err != nil {
		return nil, fmt.Errorf("init leases: %w", err)
	}
	scratch := filepath.Join(g.stateDir, "scratch")
	templates := filepath.Join(g.stateDir, "templates")
	for _, d := range []string{scratch, templates, filepath.Join(g.runDir, "bundles")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("make dir %s: %w", d, err)
		}
	}
	// Built once: rebuilding on every takeover would slow failover down.
	if _, err := os.Stat(filepath.Join(templates, "busybox", "bin", "sh")); o.busybox != "" && err != nil {
		if err := template.BuildBusybox(filepath.Join(templates, "busybox"), o.busybox); err != nil {
			log.Warn("built-in busybox template unavailable", "err", err)
		}
	}
	// --host-uds=create: each guest's agent listens in its bind-mounted
	// socket dir, and the node connects from the host.
	rt := &runsc.Runtime{Binary: o.runsc, Platform: o.runscPlatform, Version: facts.versions.Runsc,
		Root: filepath.Join(g.runDir, "runsc"), SharedRoot: true, HostUDS: "create",
		Logger: log, ExecOOMScoreAdj: &o.guestOOMAdj, LogMaxBytes: o.logMax}
	agentBin, err := stageAgent(o.agentBinary, g.runDir)
	if err != nil {
		return nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own binary for the log writer: %w", err)
	}
	// The guest's output goes through a pipe to `ctld logshim`, which keeps
	// the latest --log-max-bytes of it. The writer is placed in the lease
	// cgroup (container id == lease id), so it outlives this primary and
	// what it writes is charged to the sandbox.
	shim := guestlog.Shim{Argv: []string{exe, "logshim"}, Max: o.logMax}
	rt.InitOutput = func(id string) (*os.File, func(context.Context) error, error) {
		w, wr, err := shim.Start(rt.ContainerLogDir(id), leases.Dir(id))
		if err != nil {
			return nil, nil, err
		}
		return w, wr.Wait, nil
	}
	cfg := node.Config{
		Slot: o.slot, StateDir: g.stateDir, RunDir: g.runDir, TemplatesDir: templates,
		Reserve:  node.Capacity{CPUMillis: o.reserveCPU, MemoryBytes: o.reserveMem, PIDs: o.reservePIDs, DiskBytes: o.reserveDisk},
		Versions: facts.versions, GuestOOMScoreAdj: o.guestOOMAdj,
		// Withheld teardown retries (see node.RetryWithheld).
		WithheldRetry: o.withheldRetry, WithheldRetryMax: o.withheldRetryMax, UsageKeep: o.usageKeep, UsageRetention: o.usageRetention,
		DefaultDiskBytes:   o.defaultDisk,
		DiskProjects:       node.DiskProjects{Base: o.diskProjBase, Count: node.DefaultDiskProjects.Count},
		NetLimits:          netpolicy.Limits{MaxRules: o.net.maxRules},
		Carriers:           o.net.carriers,
		AgentBinary:        agentBin,
		AgentStreamIdle:    o.agentStreamIdle,
		AgentListBytes:     o.agentListBytes,
		ExecTimeoutDefault: o.execTimeoutDefault, ExecIdle: o.execIdle,
		ReadyTimeout:  o.readyTimeout,
		BootCPUMillis: o.bootCPU,
		RuntimePIDs:   o.runtimePIDs,
		WarmPool:      o.warm.settings(),
	}
	// /run/netns becomes a mount point before ctld names a netns there,
	// so an operator's later `ip netns add` does not hide ctld's.
	ns := &netpolicy.Netns{Logger: log}
	if err := ns.Prepare(term); err != nil {
		return nil, fmt.Errorf("prepare the netns dir: %w", err)
	}
	d := node.Deps{
		Journal: j, Identity: ident, Epoch: epoch,
		// The answers stored with operations are the API's (the node
		// never sees a wire type).
		Answers: apiserver.Answers{},
		Guest: guest.Deps{
			Leases: leases, Runtime: rt,
			// Each generation's agent socket dir: a small tmpfs, its peer
			// checked against the lease cgroup (docs/operations.md, "Guest
			// agent boundary").
			AgentDirs: node.TmpfsAgentDirs{}, AgentPeers: node.ProcPeers{},
		},
		Overlay: overlay.Deps{RootFS: &rootfs.Overlay{ScratchDir: scratch, Logger: log}},
		Network: sn.deps(ns),
		Logger:  log, Total: facts.total,
		Crash: crashHook(log), Term: term,
	}
	bcfg, bd, err := buildBlock(term, g.stateDir, o.cgroupRoot, filepath.Join(templates, "busybox"), o.block, log)
	if err != nil {
		return nil, fmt.Errorf("block mode: %w", err)
	}
	cfg.Block, d.Writers, d.Block, d.Volumes, d.ImageDefaults = bcfg, bd.Writers, bd.Block, bd.Volumes, bd.ImageDefaults
	return node.New(cfg, d), nil
}

func kernelRelease() string {
	var u syscall.Utsname
	if err := syscall.Uname(&u); err != nil {
		return ""
	}
	b := make([]byte, 0, len(u.Release))
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

// logshimCmd is the guest output writer started per generation by the
// primary (guestlog.Shim): stdin is the pipe the guest's init writes to.
func logshimCmd() *cobra.Command {
	var cfg guestlog.Config
	c := &cobra.Command{
		Use:    "logshim --dir DIR --max-bytes N",
		Short:  "copy a guest's output from stdin into a size-capped log (started by the primary)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.Dir == "" {
				return errors.New("--dir is required")
			}
			return guestlog.Run(cmd.Context(), os.Stdin, cfg)
		},
	}
	c.Flags().StringVar(&cfg.Dir, "dir", "", "the generation's log directory")
	c.Flags().Int64Var(&cfg.Max, "max-bytes", 1<<20, "cap of the guest's output log (two halves)")
	return c
}
