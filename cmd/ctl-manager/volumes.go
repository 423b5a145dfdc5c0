package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/manager"
)

// The durable block root commands (issue 10): sandbox pause|resume|
// snapshot|fork|restore and snapshot ls.

func (c *cli) volumeCommands() []*cobra.Command {
	pause := &cobra.Command{Use: "pause ID", Short: "Seal a block-mode sandbox's files as its head and release its compute (verifies the cleanup proof)", Args: exactArgs(1, "ID")}
	pause.RunE = c.managerAction(named("pause sandbox"), true, func(ctx context.Context, m *manager.Manager, args []string) error {
		fmt.Fprintf(c.stderr, "pausing %s: freeze, seal, publish the head, release...\n", args[0])
		res, err := m.Pause(ctx, args[0])
		if err != nil {
			return err
		}
		return c.printRelease(res, res.Verdict, func() {
			s := res.Seal
			fmt.Fprintf(c.stdout, "sandbox %s generation %d paused, operation %s\n", res.Sandbox.ID, res.Sandbox.Generation, res.OperationID)
			fmt.Fprintf(c.stdout, "head %d: block generation %d (writer epoch %d)\n", res.Head.Seq, res.Head.Generation, res.Head.WriterEpoch)
			fmt.Fprintf(c.stdout, "seal: %d chunks (%d data, %d zero, %d bytes) over %s; frozen %.0f ms, total %.0f ms\n",
				s.Chunks, s.DataChunks, s.ZeroChunks, s.Bytes, s.Parent, s.FreezeMS, s.TotalMS)
		})
	})

	resume := &cobra.Command{Use: "resume ID", Short: "Run a paused sandbox again from its head (its last claim's spec)", Args: exactArgs(1, "ID")}
	resume.RunE = c.managerAction(named("resume sandbox"), true, func(ctx context.Context, m *manager.Manager, args []string) error {
		res, err := m.Resume(ctx, args[0])
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(res)
		}
		sb := res.Sandbox
		fmt.Fprintf(c.stdout, "sandbox %s %s: generation %d, container %s (resumed from its head), total %.0f ms\n", sb.ID, sb.State, sb.Generation, sb.ContainerID, sb.Timings.TotalMS)
		return nil
	})

	snapshot := &cobra.Command{Use: "snapshot ID NAME", Short: "Seal a running block-mode sandbox's files under a name; the guest keeps running", Args: exactArgs(2, "ID and NAME")}
	snapshot.RunE = c.managerAction(named("snapshot sandbox"), false, func(ctx context.Context, m *manager.Manager, args []string) error {
		res, err := m.Snapshot(ctx, args[0], args[1])
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(res)
		}
		s := res.Seal
		fmt.Fprintf(c.stdout, "snapshot %s of %s: block generation %d (%d chunks, %d bytes); writes waited %.0f ms, total %.0f ms\n",
			res.Snapshot.Name, args[0], res.Snapshot.Generation, s.Chunks, s.Bytes, s.FreezeMS, s.TotalMS)
		return nil
	})

	var fromSnap string
	fork := &cobra.Command{Use: "fork SOURCE NEW [--snapshot NAME]", Short: "Make NEW a sandbox identity on SOURCE's head (or snapshot), copying nothing; `sandbox create NEW --mode block` runs it", Args: exactArgs(2, "SOURCE and NEW")}
	fork.Flags().StringVar(&fromSnap, "snapshot", "", "the source's snapshot (default: its head)")
	fork.RunE = c.managerAction(named("fork sandbox"), false, func(ctx context.Context, m *manager.Manager, args []string) error {
		v, err := m.Fork(ctx, args[0], args[1], fromSnap)
		if err != nil {
			return err
		}
		return c.printVolume(v, fmt.Sprintf("forked %s from %s", args[1], args[0]))
	})

	restore := &cobra.Command{Use: "restore ID SNAPSHOT", Short: "Move a stopped sandbox's head to one of its snapshots", Args: exactArgs(2, "ID and SNAPSHOT")}
	restore.RunE = c.managerAction(named("restore sandbox"), true, func(ctx context.Context, m *manager.Manager, args []string) error {
		v, err := m.Restore(ctx, args[0], args[1])
		if err != nil {
			return err
		}
		return c.printVolume(v, fmt.Sprintf("restored %s to snapshot %s", args[0], args[1]))
	})
	return []*cobra.Command{pause, resume, snapshot, fork, restore}
}

func (c *cli) snapshotCommand() *cobra.Command {
	g := group("snapshot", "List a sandbox volume's snapshots")
	ls := &cobra.Command{Use: "ls ID", Short: "Show a sandbox volume's head, snapshots and committed generations", Args: exactArgs(1, "ID")}
	ls.RunE = c.managerAction(named("list snapshots of"), false, func(ctx context.Context, m *manager.Manager, args []string) error {
		v, err := m.Volume(ctx, args[0])
		if err != nil {
			return err
		}
		return c.printVolume(v, "")
	})
	g.AddCommand(ls)
	return g
}

// printVolume prints a volume (after a line saying what happened, if any).
func (c *cli) printVolume(v api.VolumeInfo, what string) error {
	if c.json {
		return c.printJSON(v)
	}
	if what != "" {
		fmt.Fprintln(c.stdout, what)
	}
	gens := make([]string, len(v.Generations))
	for i, g := range v.Generations {
		gens[i] = fmt.Sprint(g)
	}
	fmt.Fprintf(c.stdout, "sandbox %s: head %d = block generation %d; generations [%s]\n", v.Sandbox, v.Head.Seq, v.Head.Generation, strings.Join(gens, " "))
	for _, s := range v.Snapshots {
		fmt.Fprintf(c.stdout, "  snapshot %-20s generation %d\n", s.Name, s.Generation)
	}
	return nil
}
