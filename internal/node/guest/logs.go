package guest

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/guestlog"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/names"
)

// A generation's log files (the guest's init output through a bounded log
// writer, runsc's own log) live in one directory per container under the
// runtime's log root; see internal/guestlog. They are a resource of the
// generation like its cgroup: made first in a claim, removed last in a
// teardown (after the lease cgroup, so no writer is left), proven gone by
// the check logs_removed, and swept as orphans on takeover.

// followPoll is how often a follow looks for new output.
const followPoll = 200 * time.Millisecond

// followStateEvery is how often a follow asks the journal whether the
// generation still runs.
const followStateEvery = time.Second

func (g *Guest) logDirs() guestlog.Dirs { return guestlog.Dirs{Root: g.d.Runtime.LogRoot()} }

func (g *Guest) listLogs(context.Context) ([]string, error) {
	return g.logDirs().List(func(s string) bool { _, _, ok := names.ParseGeneration(s); return ok })
}

// running is whether a generation in this state still has a guest that
// may write to its log.
func running(state journal.State) bool {
	return state == journal.StateClaiming || state == journal.StateReady
}

// LogsRequest asks for a generation's log.
type LogsRequest struct {
	// Runsc reads runsc's own log of the generation, not the guest's
	// init output.
	Runsc bool
	// Tail keeps the last Tail lines of what is there (0: all).
	Tail int
	// Follow sends what is written after, until the generation ends,
	// nothing comes for IdleSec (0: no bound) or Shutdown closes (the
	// server hands over; nil: never).
	Follow   bool
	IdleSec  int64
	Shutdown <-chan struct{}
}

// LogsEnd says why a log read ended and of which generation.
type LogsEnd struct {
	Generation uint64
	Reason     string
}

// Logs writes the current generation's log to w, and with req.Follow
// what the guest writes after, until the generation ends, nothing comes
// for req.IdleSec, the node hands over, or the client goes away.
func (g *Guest) Logs(ctx context.Context, id string, req LogsRequest, w io.Writer) (LogsEnd, error) {
	s, err := g.sandbox(id)
	if err != nil {
		return LogsEnd{}, err
	}
	end := LogsEnd{Generation: s.Generation}
	if !s.Holds() && !s.Withheld {
		return end, errdefs.Errorf(errdefs.CodeNotFound, "sandbox %q generation %d is %s: its log files were removed with it", id, s.Generation, s.State)
	}
	dir := g.d.Runtime.ContainerLogDir(s.ContainerID)
	name := guestlog.InitName
	if req.Runsc {
		name = guestlog.RunscName
	}
	if !req.Follow {
		// Both halves: bounded by the cap (runsc's log by the cap plus
		// what it wrote since the last cap).
		b, err := guestlog.Tail(dir, name, 1<<30)
		if err != nil {
			return end, errdefs.Errorf(errdefs.CodeInternal, "read log of %s: %v", id, err)
		}
		if _, err := w.Write(guestlog.LastLines(b, req.Tail)); err != nil {
			return end, err
		}
		end.Reason = "end of log"
		return end, nil
	}
	if !running(s.State) {
		return end, errdefs.Errorf(errdefs.CodeConflict, "sandbox %q generation %d is %s: nothing to follow (read the log without follow)", id, s.Generation, s.State)
	}
	first, fl, err := guestlog.Follow(dir, name)
	if err != nil {
		return end, errdefs.Errorf(errdefs.CodeInternal, "read log of %s: %v", id, err)
	}
	defer fl.Close()
	if _, err := w.Write(guestlog.LastLines(first, req.Tail)); err != nil {
		return end, err
	}
	idle := time.Duration(req.IdleSec) * time.Second
	lastOutput, lastState := time.Now(), time.Now()
	tick := time.NewTicker(followPoll)
	defer tick.Stop()
	// drain sends what is there now; a write error means the client left.
	drain := func() error {
		for {
			b, err := fl.Next(256 << 10)
			if err != nil {
				return errdefs.Errorf(errdefs.CodeInternal, "follow log of %s: %v", id, err)
			}
			if len(b) == 0 {
				return nil
			}
			lastOutput = time.Now()
			if _, err := w.Write(b); err != nil {
				return err
			}
		}
	}
	for {
		select {
		case <-ctx.Done():
			return end, errdefs.Errorf(errdefs.CodeUnavailable, "follow log of %s: %v", id, ctx.Err())
		case <-req.Shutdown:
			if err := drain(); err != nil {
				return end, err
			}
			end.Reason = "the primary is handing over: follow again once the new primary serves"
			return end, nil
		case <-tick.C:
		}
		if err := drain(); err != nil {
			return end, err
		}
		if time.Since(lastState) >= followStateEvery {
			lastState = time.Now()
			cur, err := g.sandbox(id)
			if err != nil && errdefs.CodeOf(err) != errdefs.CodeNotFound {
				return end, err
			}
			if err != nil || cur.Generation != s.Generation || !running(cur.State) {
				if err := drain(); err != nil {
					return end, err
				}
				state := "gone"
				if err == nil && cur.Generation == s.Generation {
					state = string(cur.State)
				}
				end.Reason = fmt.Sprintf("generation %d ended (%s)", s.Generation, state)
				return end, nil
			}
		}
		if time.Since(lastOutput) >= idle {
			end.Reason = fmt.Sprintf("no output for %v (idle_sec %d); generation %d still runs: follow again to wait longer", idle, req.IdleSec, s.Generation)
			return end, nil
		}
	}
}
