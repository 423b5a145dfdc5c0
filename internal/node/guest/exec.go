package guest

import (
	"bytes"
	"context"
	"io"
	"time"

	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/runsc"
)

func (g *Guest) begin(ctx context.Context) (context.Context, func(), error) { return g.d.Begin(ctx) }
func (g *Guest) sandbox(id string) (journal.Sandbox, error)                 { return g.d.Sandbox(id) }

// live is the term's Live.
func (g *Guest) live() error { return g.d.Live() }

// ReadySandbox is sandbox id's record if its generation is ready
// (conflict if not, not_found if the journal never saw it).
func (g *Guest) ReadySandbox(id string) (journal.Sandbox, error) {
	s, err := g.sandbox(id)
	if err != nil {
		return s, err
	}
	if s.State != journal.StateReady {
		return s, errdefs.Errorf(errdefs.CodeConflict, "sandbox %q generation %d is %s, not ready", id, s.Generation, s.State)
	}
	return s, nil
}

// workloadUser is the uid and gid of the sandbox's main process, as its
// claim asked for them: what an exec runs as unless it names a user.
func workloadUser(s journal.Sandbox) (uid, gid uint32) {
	if s.Request == nil {
		return 0, 0
	}
	return s.Request.Process.UID, s.Request.Process.GID
}

// execProcess is what runsc exec runs for req in sandbox s: as req's user,
// or else as the workload's, never as root by default.
func execProcess(s journal.Sandbox, req ExecRequest) runsc.ExecProcess {
	uid, gid := workloadUser(s)
	if req.User != nil {
		uid, gid = req.User.UID, req.User.GID
	}
	return runsc.ExecProcess{Args: req.Args, Env: req.Env, Cwd: req.Cwd, UID: uid, GID: gid}
}

// ExecViaRunsc runs a command in the sandbox's guest through runsc exec:
// the operator's fallback when the agent does not answer, charged to the
// sandbox's lease.
func (g *Guest) ExecViaRunsc(ctx context.Context, id string, req ExecRequest, stdout, stderr io.Writer) (int, error) {
	ctx, done, err := g.begin(ctx)
	if err != nil {
		return -1, err
	}
	defer done()
	s, err := g.ReadySandbox(id)
	if err != nil {
		return -1, err
	}
	if req.TimeoutSec > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.TimeoutSec)*time.Second)
		defer cancel()
	}
	var stdin io.Reader
	if len(req.Stdin) > 0 {
		stdin = bytes.NewReader(req.Stdin)
	}
	// runsc exec runs in the sandbox's lease, charged to the sandbox like
	// the rest of its processes.
	p := execProcess(s, req)
	if p.CgroupDir = g.d.Leases.Dir(s.LeaseID); p.CgroupDir == "" {
		return -1, errdefs.Errorf(errdefs.CodeInternal, "exec in %s: no lease cgroup %q", id, s.LeaseID)
	}
	code, err := g.d.Runtime.Exec(ctx, s.ContainerID, p, stdin, stdout, stderr)
	if err != nil {
		if ctx.Err() != nil {
			return -1, errdefs.Errorf(errdefs.CodeUnavailable, "exec in %s: %v", id, ctx.Err())
		}
		return -1, errdefs.Errorf(errdefs.CodeInternal, "exec in %s: %v", id, err)
	}
	return code, nil
}
