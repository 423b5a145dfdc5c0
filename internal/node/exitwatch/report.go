// Package exitwatch sees a generation's guest end the moment it does and
// tells how: the primary watches each live generation's lease cgroup
// (cgroup.events "populated 0": the runsc sandbox and gofer, which are all
// the lease holds, are gone), then reads the guest agent's exit report
// (the workload's status, left in the agent's socket directory on the
// host) and the lease's memory.events, and names the end: a normal exit
// with its code, an OOM kill, or a crash (the guest died without its
// agent's report). The node journals what Classify says.
package exitwatch

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/agent/wire"
	"github.com/ctld/ctld/internal/journal"
)

// ReadReport reads the agent's exit report in the generation's agent
// socket directory dir. The directory is the guest's to write (guest root
// can put anything there), so the file is opened without following a
// symlink and without blocking (a FIFO), must be a regular file, and at
// most wire.MaxExitReport bytes are read. found is false when there is no
// report.
func ReadReport(dir string) (r wire.ExitReport, found bool, err error) {
	p := filepath.Join(dir, wire.ExitReportName)
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if errors.Is(err, unix.ENOENT) {
		return r, false, nil
	}
	if err != nil {
		return r, false, fmt.Errorf("open exit report %s: %w", p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return r, false, fmt.Errorf("stat exit report %s: %w", p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return r, false, fmt.Errorf("exit report %s is not a regular file (mode %#o)", p, st.Mode)
	}
	b, err := io.ReadAll(io.LimitReader(f, wire.MaxExitReport+1))
	if err != nil {
		return r, false, fmt.Errorf("read exit report %s: %w", p, err)
	}
	if len(b) > wire.MaxExitReport {
		return r, false, fmt.Errorf("exit report %s: over %d bytes", p, wire.MaxExitReport)
	}
	if err := wire.Decode(b, &r); err != nil {
		return r, false, fmt.Errorf("exit report %s: %w", p, err)
	}
	if r.Code < 0 || r.Code > 255 {
		return r, false, fmt.Errorf("exit report %s: code %d out of 0..255", p, r.Code)
	}
	return r, true, nil
}

// Facts are what the watch read once the guest was gone.
type Facts struct {
	Report      wire.ExitReport
	ReportFound bool
	ReportErr   error // a report that could not be read (bad, oversized)
	// OOMKills is the lease's memory.events oom_kill, as at the claim
	// (0) and now; OOMErr when it could not be read.
	OOMKills int64
	OOMErr   error
}

// Classify names the end from the facts (plain data, no effect). The
// agent writes its report only when the workload ended on its own (or by
// a signal from inside the guest), right before the guest's init exits;
// without one, the guest died under it: by the lease's OOM kill when
// memory.events counted one, else a crash (sentry or gofer died, or was
// killed from the host).
func Classify(f Facts) journal.ExitRecord {
	e := journal.ExitRecord{Code: -1, OOMKills: f.OOMKills}
	switch {
	case f.ReportFound:
		e.Kind, e.Code = journal.ExitNormal, f.Report.Code
		if f.OOMKills > 0 {
			e.Detail = fmt.Sprintf("the workload exited with %d after %d OOM kill(s) in the lease", f.Report.Code, f.OOMKills)
		}
	case f.OOMKills > 0:
		e.Kind = journal.ExitOOM
		e.Detail = fmt.Sprintf("killed at the lease's memory.max (%d OOM kill(s))", f.OOMKills)
	default:
		e.Kind = journal.ExitCrash
		e.Detail = "the guest ended without its agent's exit report (sentry or gofer died)"
	}
	if f.ReportErr != nil {
		e.Detail = joinDetail(e.Detail, "bad exit report: "+f.ReportErr.Error())
	}
	if f.OOMErr != nil {
		e.Detail = joinDetail(e.Detail, "memory.events unread: "+f.OOMErr.Error())
	}
	return e
}

func joinDetail(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// Reason is the record's reason line for an exit.
func Reason(e journal.ExitRecord) string {
	switch e.Kind {
	case journal.ExitNormal:
		return fmt.Sprintf("exited: code %d", e.Code)
	case journal.ExitOOM:
		return "exited: OOM killed"
	default:
		return "exited: guest crashed"
	}
}
