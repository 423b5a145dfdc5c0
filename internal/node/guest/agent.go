package guest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ctld/ctld/internal/agent"
	"github.com/ctld/ctld/internal/agent/client"
	"github.com/ctld/ctld/internal/agent/wire"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/guestlog"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/node/resource"
	"github.com/ctld/ctld/internal/proof"
	"github.com/ctld/ctld/internal/runsc"
)

// The guest agent (cmd/ctl-agent, docs/architecture.md "Guest agent") is
// every generation's init. Its host side is one directory per generation,
// <RunDir>/agents/<container id>, root-only:
//   - bin/ctl-agent: a hard link of the node's agent binary (a copy where
//     no link can be made), bound read-only at runsc.AgentBinDir;
//   - sock/: a small tmpfs of its own (Deps.AgentDirs, agentsock.go),
//     bound read-write at runsc.AgentSocketDir, where the agent
//     listens (runsc --host-uds=create lets the host connect); before
//     start it holds the nonce file (runsc.AgentNonce, 0400), which the
//     agent reads and removes before it starts anything.
// Every path derives from the container id, so a new primary reaches the
// agents of the generations it adopts from the journal alone.

// AgentsDirName is the run dir's directory of the agents' dirs.
const AgentsDirName = "agents"

func (g *Guest) agentsDir() string { return filepath.Join(g.cfg.RunDir, AgentsDirName) }

// agentDir is the host directory of generation cid's agent.
func (g *Guest) agentDir(cid string) string { return filepath.Join(g.agentsDir(), cid) }

func (g *Guest) agentBinDir(cid string) string  { return filepath.Join(g.agentDir(cid), "bin") }
func (g *Guest) AgentSockDir(cid string) string { return filepath.Join(g.agentDir(cid), "sock") }

// agentSocket is the host path of generation cid's agent socket.
func (g *Guest) agentSocket(cid string) string {
	return filepath.Join(g.AgentSockDir(cid), runsc.AgentSocket)
}

// agentClient calls the agent of rec's generation.
func (g *Guest) agentClient(rec journal.Sandbox) *client.Client {
	dir := g.AgentSockDir(rec.ContainerID)
	return &client.Client{
		Socket: g.agentSocket(rec.ContainerID), CallTimeout: g.cfg.AgentCallTimeout, StreamIdle: g.cfg.AgentStreamIdle,
		ListBudget: g.cfg.AgentListBytes,
		Dial: func(ctx context.Context) (net.Conn, error) {
			c, err := DialInDir(ctx, dir, runsc.AgentSocket)
			if err != nil {
				return nil, err
			}
			pid, err := peerPID(c)
			if err == nil {
				err = g.d.AgentPeers.CheckPeer(pid, g.d.Leases.CgroupsPath(rec.LeaseID))
			}
			if err != nil {
				c.Close()
				return nil, fmt.Errorf("agent of %s generation %d: %w", rec.ID, rec.Generation, err)
			}
			return c, nil
		},
	}
}

// agentSpec is what the OCI spec of rec's generation needs of its agent.
func (g *Guest) agentSpec(rec journal.Sandbox) *runsc.Agent {
	uid, gid := workloadUser(rec)
	return &runsc.Agent{
		BinDir: g.agentBinDir(rec.ContainerID), SocketDir: g.AgentSockDir(rec.ContainerID),
		Env: []string{
			agent.EnvUID + "=" + strconv.FormatUint(uint64(uid), 10),
			agent.EnvGID + "=" + strconv.FormatUint(uint64(gid), 10),
		},
	}
}

// agentResource is the generation's agent directory (see above).
type agentResource struct {
	g *Guest
}

func (agentResource) Spec() resource.Spec {
	return resource.Spec{Kind: journal.KindAgent, Phase: resource.PhaseGuest, Check: "agent_dir_removed", Sweeps: true}
}
func (r agentResource) Make(_ context.Context, c *resource.Claim) error {
	src := r.g.cfg.AgentBinary
	if src == "" {
		return errdefs.Errorf(errdefs.CodeUnavailable, "no guest agent binary configured on this node")
	}
	cid := c.Rec.ContainerID
	for _, d := range []string{r.g.agentsDir(), r.g.agentDir(cid), r.g.agentBinDir(cid), r.g.AgentSockDir(cid)} {
		if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("make agent dir: %w", err)
		}
	}
	if err := r.g.d.AgentDirs.Mount(r.g.AgentSockDir(cid)); err != nil {
		return err
	}
	dst := filepath.Join(r.g.agentBinDir(cid), runsc.AgentBinary)
	if err := os.Remove(dst); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("place agent binary: %w", err)
	}
	// A link costs no memory on the run dir's tmpfs, and the generation
	// keeps the binary it started with when the node's is replaced.
	if err := os.Link(src, dst); err != nil {
		if err := copyFile(src, dst, 0o755); err != nil {
			return fmt.Errorf("place agent binary: %w", err)
		}
	}
	return writeNonce(filepath.Join(r.g.AgentSockDir(cid), runsc.AgentNonce), c.Rec.Nonce)
}

// writeNonce writes the generation's nonce where its agent reads it:
// root-only (0400 in a 0700 directory, which the guest sees as such), not
// env or argv, which every guest user can read in /proc. A retried make
// replaces the file of the attempt before.
func writeNonce(path, nonce string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("write agent nonce: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o400)
	if err != nil {
		return fmt.Errorf("write agent nonce: %w", err)
	}
	if _, err := f.WriteString(nonce); err != nil {
		f.Close()
		return fmt.Errorf("write agent nonce: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write agent nonce: %w", err)
	}
	return nil
}
func (r agentResource) Remove(_ context.Context, rec journal.Sandbox) error {
	return r.g.removeAgentDir(rec.ContainerID)
}

// removeAgentDir unmounts the socket dir's tmpfs, then removes it all.
func (g *Guest) removeAgentDir(cid string) error {
	if err := g.d.AgentDirs.Unmount(g.AgentSockDir(cid)); err != nil {
		return err
	}
	return os.RemoveAll(g.agentDir(cid))
}
func (r agentResource) Gone(_ context.Context, rec journal.Sandbox) proof.Check {
	return resource.PathGone("agent_dir_removed", r.g.agentDir(rec.ContainerID))
}
func (r agentResource) List(context.Context) ([]string, error) {
	return resource.DirEntries(r.g.agentsDir())
}
func (agentResource) Name(rec journal.Sandbox) string { return resource.NameOf(rec) }
func (r agentResource) RemoveOrphan(_ context.Context, name string) error {
	return r.g.removeAgentDir(name)
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// DefaultReadyTimeout is Config.ReadyTimeout's default: a guest's agent
// answers within seconds of runsc start, also under emulation (a loaded
// test VM took over a minute for create and start alone).
const DefaultReadyTimeout = 2 * time.Minute

// readyPoll is how often awaitAgent asks an agent that did not answer yet.
// Fixed, not backing off: the answer's own cost is a failed connect on the
// host (microseconds), while a backoff to 50 ms added up to its step to
// every claim's readiness (on a build machine the agent answers 20-40 ms
// after runsc start, where the old 2 ms doubling polled at 30 and 62 ms).
const readyPoll = 5 * time.Millisecond

// awaitAgent is the readiness proof's wait: it asks the generation's
// agent for its nonce until it answers, refuses (the workload could not
// start), the guest's processes are gone (its init exited), or the bound
// passes.
func (g *Guest) awaitAgent(ctx context.Context, rec journal.Sandbox) (string, error) {
	bound := g.cfg.ReadyTimeout
	if bound <= 0 {
		bound = DefaultReadyTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	c := g.agentClient(rec)
	var last error
	for i := 0; ; i++ {
		nonce, err := c.Ready(ctx)
		if err == nil {
			return nonce, nil
		}
		if we := (*wire.Error)(nil); errors.As(err, &we) {
			// An agent that answers but refuses (not_started: the workload
			// could not start) will not change its mind.
			return "", fmt.Errorf("readiness: the guest agent refused: %w", err)
		}
		if last == nil || ctx.Err() == nil {
			last = err // not the bound's own cut of the last try
		}
		if ctx.Err() != nil {
			break
		}
		// Every 20 tries (~100 ms): a guest whose init exited never answers.
		if i%20 == 19 {
			if alive, perr := g.d.Leases.Populated(ctx, rec.LeaseID); perr == nil && !alive {
				return "", fmt.Errorf("readiness: the guest exited before its agent answered%s%s: %w", g.initTail(rec), g.BootState(context.WithoutCancel(ctx), rec), last)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(readyPoll):
		}
	}
	return "", fmt.Errorf("readiness: the guest agent at %s did not answer with the nonce within %v%s%s: %w", g.agentSocket(rec.ContainerID), bound, g.initTail(rec), g.BootState(context.WithoutCancel(ctx), rec), last)
}

// Ready is the readiness proof's guest side: the generation's agent
// answers with its nonce, and then the boot CPU allowance ends, before the
// generation is published: a ready generation always runs at its claim's
// share. (A takeover rolls back a claim still at its allowance.)
func (g *Guest) Ready(ctx context.Context, rec journal.Sandbox) (nonce string, err error) {
	if nonce, err = g.awaitAgent(ctx, rec); err != nil {
		return "", err
	}
	if spec := LeaseSpec(rec.ContainerID, rec.Resources, g.cfg.BootCPUMillis, rec.RuntimePIDs); spec.BootCPUMillis > 0 {
		if err := g.d.Leases.SetCPUMax(ctx, rec.LeaseID, spec.CPUMillis); err != nil {
			return "", fmt.Errorf("end the boot CPU allowance: %w", err)
		}
	}
	return nonce, nil
}

// BootState says how a guest that never became ready fared: what its
// sandbox or gofer wrote to its panic log (a Go panic or fatal error, such
// as a thread refused at pids.max), how it fared in its lease (OOM kills,
// forks refused, memory peak, CPU used and throttling) and what runsc's
// log said last, for a readiness failure's message.
func (g *Guest) BootState(ctx context.Context, rec journal.Sandbox) string {
	var parts []string
	if s, err := runsc.PanicSummary(filepath.Join(g.d.Runtime.ContainerLogDir(rec.ContainerID), guestlog.PanicName), 4, 1024); err == nil && s != "" {
		parts = append(parts, fmt.Sprintf("runsc panic log: %q", s))
	}
	if st, err := g.d.Leases.Stats(ctx, rec.LeaseID); err == nil {
		if st.OOMKills > 0 {
			parts = append(parts, fmt.Sprintf("OOM-killed %d time(s) at memory.max %d bytes", st.OOMKills, rec.Resources.MemoryBytes))
		}
		if st.PIDsMaxEvents > 0 {
			// Threads count: the sentry's, the gofer's and ptrace's stubs.
			parts = append(parts, fmt.Sprintf("%d forks refused at pids.max %d", st.PIDsMaxEvents, rec.Resources.PIDs+rec.RuntimePIDs))
		}
		parts = append(parts, fmt.Sprintf("lease: %d processes, %d tasks, memory peak %d of %d bytes, CPU used %.1f s, throttled in %d periods",
			st.Procs, st.PIDsCurrent, st.MemoryPeak, rec.Resources.MemoryBytes, float64(st.CPUUsageUsec)/1e6, st.NrThrottled))
	}
	if b, err := guestlog.Tail(g.d.Runtime.ContainerLogDir(rec.ContainerID), guestlog.RunscName, 2048); err == nil {
		if b = bytes.TrimSpace(guestlog.LastLines(b, 3)); len(b) > 0 {
			parts = append(parts, fmt.Sprintf("runsc log: %q", b))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, "; ") + ")"
}

// initTail is the end of the guest's init output (the agent's and the
// workload's), for a readiness failure's message: a failed claim's logs
// are removed with its generation.
func (g *Guest) initTail(rec journal.Sandbox) string {
	b, err := guestlog.Tail(g.d.Runtime.ContainerLogDir(rec.ContainerID), guestlog.InitName, 512)
	if b = bytes.TrimSpace(guestlog.LastLines(b, 4)); err != nil || len(b) == 0 {
		return ""
	}
	return fmt.Sprintf(" (guest output: %q)", b)
}

// WarmHostname is a warm pool member's hostname until its claim sets the
// claim's.
const WarmHostname = "warm"

// WarmClaimTimeout bounds a warm member's claim call. A live member
// answers it in one agent round trip (p99 1.9 s in the loaded TCG test
// VM, ~0.15 s on a quiet one); past this a cold claim (3.5-9 s there)
// is the better bet, and the node falls back to one (destroying the
// member), so a hung member costs a claim at most this much.
const WarmClaimTimeout = 10 * time.Second

// WarmClaim is a warm member's claim (rec: the claim's generation record,
// which names the member's objects): the member's agent starts rec's
// workload with its user, args, env and cwd, sets rec's hostname, and
// answers rec's nonce, the readiness proof. The boot CPU allowance ended
// at the member's own readiness.
func (g *Guest) WarmClaim(ctx context.Context, rec journal.Sandbox) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, WarmClaimTimeout)
	defer cancel()
	req := rec.Request
	if req == nil {
		return "", fmt.Errorf("warm claim of %s generation %d: no request recorded", rec.ID, rec.Generation)
	}
	args := req.Process.Args
	if len(args) == 0 {
		args = g.cfg.DefaultArgs
	}
	nonce, err := g.agentClient(rec).Claim(ctx, client.ClaimRequest{
		Nonce: rec.Nonce, User: wire.User{UID: req.Process.UID, GID: req.Process.GID},
		Args: args, Env: req.Process.Env, Cwd: req.Process.Cwd, Hostname: rec.ID,
	})
	if err != nil {
		return "", fmt.Errorf("readiness: the warm member's agent refused the claim%s: %w", g.initTail(rec), err)
	}
	return nonce, nil
}
