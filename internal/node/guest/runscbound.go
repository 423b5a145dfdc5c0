package guest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ctld/ctld/internal/journal"
)

// errRunscBound is the cause of a runsc step's context when its bound
// passed (not the caller's cancellation or the term's end).
var errRunscBound = errors.New("runsc step bound passed")

// runscKillTimeout bounds the kill through the lease that ends a runsc
// step past its bound (the kernel empties a lease in milliseconds).
const runscKillTimeout = 30 * time.Second

// readyTimeout is Config.ReadyTimeout or its default.
func (g *Guest) readyTimeout() time.Duration {
	if g.cfg.ReadyTimeout <= 0 {
		return DefaultReadyTimeout
	}
	return g.cfg.ReadyTimeout
}

// runscStep runs one runsc step of rec's claim (create, start) within the
// ready timeout. runsc waits on the sandbox it started, which may never
// answer (a sentry starved at pids.max, a frozen lease: issue 21, a claim
// at --runtime-pids 0 hung 10 minutes past --ready-timeout), and the
// claim's context is its caller's, which may wait for ever. Past the
// bound the guest is killed through its lease (the sandbox and gofer;
// the runsc process itself dies with the step's context), and the error
// says which step timed out and how the guest fared.
func (g *Guest) runscStep(ctx context.Context, rec journal.Sandbox, step string, fn func(context.Context) error) error {
	bound := g.readyTimeout()
	sctx, cancel := context.WithTimeoutCause(ctx, bound, errRunscBound)
	defer cancel()
	// kill ends the guest once the bound passed. A caller that went away
	// needs none (the rollback kills); an ended term leaves it to the next
	// primary's rollback and says so.
	kill := func() error {
		switch {
		case !errors.Is(context.Cause(sctx), errRunscBound):
			return nil
		case g.live() != nil:
			return g.live()
		}
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), runscKillTimeout)
		defer cancel()
		if err := g.d.Leases.Kill(kctx, rec.LeaseID); err != nil {
			return fmt.Errorf("killing the guest through its lease failed: %w", err)
		}
		return nil
	}
	killed := make(chan error, 1)
	stop := context.AfterFunc(sctx, func() { killed <- kill() })
	err := fn(sctx)
	// The step may see its deadline before the context runs its after
	// func: stop then reports it never ran, and the kill runs here.
	stopped := stop()
	if !errors.Is(context.Cause(sctx), errRunscBound) || (stopped && err == nil) {
		return err
	}
	var kerr error
	if stopped {
		kerr = kill()
	} else {
		kerr = <-killed
	}
	how := "the guest was killed through its lease"
	if kerr != nil {
		how = kerr.Error()
	}
	return fmt.Errorf("runsc %s did not finish within %v (the ready timeout); %s%s: %w", step, bound, how, g.BootState(context.WithoutCancel(ctx), rec), err)
}
