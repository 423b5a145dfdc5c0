package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/logging"
	"github.com/ctld/ctld/internal/manager"
	"github.com/ctld/ctld/internal/nodeagent"
)

// The fleet's node commands: `node run` is the node process next to a
// ctld (systemd/ctl-manager-node.service); `node ls`, `cordon`,
// `uncordon` and `drain` are the operator's view and switches, over the
// manager's database.

func (c *cli) fleetCommands() []*cobra.Command {
	return []*cobra.Command{c.nodeRunCommand(), c.nodeLsCommand(),
		c.nodeStateCommand("cordon", manager.NodeCordoned, "Take no new sandboxes on a node (those on it keep running)"),
		c.nodeStateCommand("uncordon", manager.NodeReady, "Let a cordoned or draining node take sandboxes again"),
		c.nodeDrainCommand(),
	}
}

// nodeDrainCommand: `node drain ID` marks the node draining, pauses its
// block sandboxes through its node process (a resume places them
// elsewhere) and waits up to --wait for the rest, printing progress.
func (c *cli) nodeDrainCommand() *cobra.Command {
	var wait, poll time.Duration
	cmd := &cobra.Command{Use: "drain NODE_ID", Short: "Drain a node: take no new sandboxes, pause its block sandboxes (resumed elsewhere), wait for the rest", Args: exactArgs(1, "NODE_ID")}
	cmd.Flags().DurationVar(&wait, "wait", 0, "then wait this long for its other sandboxes (overlay roots, which cannot move) to end; left over at the end: exit status 1")
	cmd.Flags().DurationVar(&poll, "poll", time.Second, "look at the node's sandboxes this often while waiting")
	cmd.RunE = c.storeAction(func(args []string) string { return "node drain " + args[0] }, func(ctx context.Context, st *manager.Store, args []string) error {
		if poll <= 0 || wait < 0 {
			return usageError{fmt.Errorf("--poll must be positive and --wait not negative")}
		}
		m := &manager.Manager{Store: st, Fleet: &manager.Fleet{}, Log: logging.OrDiscard(nil)}
		last := ""
		res, err := m.Drain(ctx, args[0], wait, poll, func(s manager.DrainStatus) {
			line := fmt.Sprintf("node %s: %d paused, %d failed, %d left", s.Node, len(s.Paused), len(s.Failed), len(s.Left))
			if line != last && !c.json {
				fmt.Fprintln(c.stdout, line)
			}
			last = line
		})
		if err != nil {
			return err
		}
		if c.json {
			if err := c.printJSON(res); err != nil {
				return err
			}
		} else {
			for _, f := range res.Failed {
				fmt.Fprintf(c.stdout, "pause failed: %s\n", f)
			}
			for _, l := range res.Left {
				fmt.Fprintf(c.stdout, "still on the node: %s\n", l)
			}
		}
		switch {
		case len(res.Failed) > 0:
			return fmt.Errorf("drain %s: %d pauses failed", res.Node, len(res.Failed))
		case wait > 0 && len(res.Left) > 0:
			return fmt.Errorf("drain %s: %d sandboxes still on the node after %v", res.Node, len(res.Left), wait)
		}
		return nil
	})
	return cmd
}

func (c *cli) nodeRunCommand() *cobra.Command {
	a := &nodeagent.Agent{}
	cmd := &cobra.Command{Use: "run", Short: "Run the node process: register this node's ctld in the database, heartbeat, carry out the claims placed on it", Args: noArgs}
	f := cmd.Flags()
	f.StringVar(&a.Name, "name", "", "the node's name for operators (default: its node id)")
	f.StringVar(&a.Platform, "platform", "systrap", "runsc's platform on this node")
	f.StringSliceVar(&a.Templates, "template", nil, "a template this node holds (repeat, or comma-separated)")
	f.Int64Var(&a.MaxSandboxes, "max-sandboxes", 0, "at most this many sandboxes here (0: one per address of ctld's pool)")
	f.DurationVar(&a.TTL, "ttl", 15*time.Second, "a heartbeat keeps the node alive this long")
	f.DurationVar(&a.Grace, "grace", 30*time.Second, "a node silent this long past its TTL is marked lost")
	f.DurationVar(&a.Poll, "poll", time.Second, "ask the database for work this often")
	f.DurationVar(&a.UsagePull, "usage-pull", 10*time.Second, "page ctld's usage records into the database this often (0: never; idle timers then see no egress)")
	f.IntVar(&a.MaxConcurrent, "max-concurrent", 8, "operations carried out on ctld at once (a sandbox's one at a time)")
	var chf channelFlags
	var chListen string
	chf.register(f)
	f.StringVar(&chListen, "channel-listen", "", "serve the node channel (mTLS: exec, files, logs of this node's sandboxes for the managers) on this address; needs --cluster-ca, --channel-cert, --channel-key")
	f.StringVar(&a.Channel, "channel-advertise", "", "the node channel's host:port as managers reach it (default: --channel-listen's address)")
	// Not c.action: the process runs until it is stopped, not --timeout.
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		c.ran = true
		if a.TTL <= 0 || a.Grace <= 0 || a.Poll <= 0 {
			return usageError{fmt.Errorf("--ttl, --grace and --poll must be positive")}
		}
		st, err := c.openStore(cmd.Context())
		if err != nil {
			return opError{"node run", err}
		}
		defer st.Close()
		a.Store, a.Client = st, &api.Client{SocketPath: c.socket}
		a.ListenDSN = c.db // PostgreSQL: LISTEN for placed work too
		// The process logs at info level even without -v: it is a service.
		level := slog.LevelInfo
		if c.verbose {
			level = slog.LevelDebug
		}
		a.Log = logging.New(c.stderr, level)
		ctx, cancel := context.WithCancel(cmd.Context())
		defer cancel()
		switch ok, err := chf.set(); {
		case err != nil:
			return err
		case ok != (chListen != ""):
			return usageError{fmt.Errorf("--channel-listen and --cluster-ca, --channel-cert, --channel-key go together")}
		case ok:
			addr, errc, err := chf.serveChannel(ctx, chListen, c.socket)
			if err != nil {
				return opError{"node run", err}
			}
			if a.Channel == "" {
				a.Channel = addr.String()
			}
			a.Log.Info("node channel serving", "listen", addr.String(), "advertise", a.Channel)
			go func() {
				if err := <-errc; err != nil && ctx.Err() == nil {
					a.Log.Error("node channel stopped", "err", err)
					cancel()
				}
			}()
		}
		if err := a.Run(ctx); err != nil {
			return opError{"node run", err}
		}
		return nil
	}
	return cmd
}

func (c *cli) nodeLsCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "ls", Short: "List the fleet's registered nodes: state, heartbeat, capacity reserved of allocatable, what a warm pool holds", Args: noArgs}
	cmd.RunE = c.storeAction(fixed("node ls"), func(ctx context.Context, st *manager.Store, _ []string) error {
		nodes, err := st.FleetNodes(ctx)
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(orNone(nodes))
		}
		tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NODE\tNAME\tSTATE\tHEARTBEAT\tSANDBOXES\tCPU\tMEMORY\tROOTS\tTEMPLATES")
		for _, n := range nodes {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d/%d\t%s/%s\t%s/%s\t%s\t%s\n", n.NodeID, n.Name, n.State,
				n.HeartbeatAt.UTC().Format(time.RFC3339), n.Reserved.Sandboxes, n.Allocatable.Sandboxes,
				manager.FormatCPU(n.Reserved.CPUMillis), manager.FormatCPU(n.Allocatable.CPUMillis),
				manager.FormatMemory(n.Reserved.MemoryBytes), manager.FormatMemory(n.Allocatable.MemoryBytes),
				strings.Join(n.RootModes, ","), strings.Join(n.Templates, ","))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, n := range nodes {
			if n.Reason != "" {
				fmt.Fprintf(c.stdout, "%s: %s\n", n.NodeID, n.Reason)
			}
			// Placement counts it beside the reservations.
			if n.Warm != (manager.NodeAlloc{}) {
				fmt.Fprintf(c.stdout, "%s: warm pool holds %s cpu, %s memory, %d sandboxes\n", n.NodeID,
					manager.FormatCPU(n.Warm.CPUMillis), manager.FormatMemory(n.Warm.MemoryBytes), n.Warm.Sandboxes)
			}
		}
		return nil
	})
	return cmd
}

func orNone[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func (c *cli) nodeStateCommand(verb, state, short string) *cobra.Command {
	cmd := &cobra.Command{Use: verb + " NODE_ID", Short: short, Args: exactArgs(1, "NODE_ID")}
	cmd.RunE = c.storeAction(func(args []string) string { return "node " + verb + " " + args[0] }, func(ctx context.Context, st *manager.Store, args []string) error {
		n, err := st.SetNodeState(ctx, args[0], state)
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(n)
		}
		fmt.Fprintf(c.stdout, "node %s is %s\n", n.NodeID, n.State)
		return nil
	})
	return cmd
}
