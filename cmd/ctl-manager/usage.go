package main

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/manager"
)

// ctl-manager usage: the metering stream's records the manager stored
// (ctl-manager serve pulls them; --pull pulls first), summed per sandbox
// and per owner over a time range.

func (c *cli) usageCommand() *cobra.Command {
	var owner, sandbox, since, until string
	var pull bool
	cmd := &cobra.Command{
		Use:   "usage [--owner O] [--sandbox ID] [--since T] [--until T] [--pull]",
		Short: "Sum the metered usage per sandbox and per owner over a time range",
		Long: "Sums the usage records whose period ends in (--since, --until]: CPU, IO, egress and wall time summed,\n" +
			"memory and PIDs peaks and disk used as their maximum. T is RFC 3339 (2026-12-07T00:00:00Z) or a\n" +
			"duration before now (24h). --pull first stores what the node's stream has that the database does not.",
		Args: noArgs,
	}
	f := cmd.Flags()
	f.StringVar(&owner, "owner", "", "only this owner's sandboxes")
	f.StringVar(&sandbox, "sandbox", "", "only this sandbox")
	f.StringVar(&since, "since", "", "records ending after T")
	f.StringVar(&until, "until", "", "records ending at or before T")
	f.BoolVar(&pull, "pull", false, "pull the node's usage records (GET /v1/usage) into the database first")
	cmd.RunE = c.storeAction(fixed("usage"), func(ctx context.Context, st *manager.Store, _ []string) error {
		now := time.Now()
		q := manager.UsageQuery{Owner: owner, SandboxID: sandbox}
		var err error
		if q.Since, err = parseWhen(since, now); err != nil {
			return usageError{fmt.Errorf("--since: %w", err)}
		}
		if q.Until, err = parseWhen(until, now); err != nil {
			return usageError{fmt.Errorf("--until: %w", err)}
		}
		if pull {
			p := manager.UsagePuller{Store: st, Source: &api.Client{SocketPath: c.socket}, Log: c.logger()}
			if _, err := p.PullOnce(ctx); err != nil {
				return err
			}
		}
		bySandbox, err := st.SumUsage(ctx, q, true)
		if err != nil {
			return err
		}
		byOwner, err := st.SumUsage(ctx, q, false)
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(struct {
				Sandboxes []manager.UsageSum `json:"sandboxes"`
				Owners    []manager.UsageSum `json:"owners"`
			}{orEmpty(bySandbox), orEmpty(byOwner)})
		}
		w := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "OWNER\tSANDBOX\tRECORDS\tCPU_S\tMEM_PEAK\tPIDS_PEAK\tIO_READ\tIO_WRITE\tDISK\tTX_BYTES\tTX_PKTS\tDROPPED\tWALL_S")
		row := func(s manager.UsageSum, id string) {
			u := s.Usage
			o := s.Owner
			if o == "" {
				o = "-"
			}
			fmt.Fprintf(w, "%s\t%s\t%d\t%.3f\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%.1f\n", o, id, s.Records, float64(u.CPUUsec)/1e6,
				u.MemoryPeakBytes, u.PIDsPeak, u.IOReadBytes, u.IOWriteBytes, u.DiskUsedBytes, u.TxBytes, u.TxPackets, u.DroppedPackets, float64(u.WallMS)/1e3)
		}
		for _, s := range bySandbox {
			row(s, s.SandboxID)
		}
		for _, s := range byOwner {
			row(s, "(all)")
		}
		return w.Flush()
	})
	return cmd
}

func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// parseWhen reads an RFC 3339 time or a duration before now ("" is zero).
func parseWhen(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time nor a duration before now", s)
	}
	return now.Add(-d), nil
}
