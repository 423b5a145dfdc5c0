package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// healthCheck is one health check. It must honour ctx; the monitor also stops
// waiting for it at the timeout (a syscall stuck in a frozen filesystem does
// not return), and reports it failing for as long as it has not returned.
type healthCheck struct {
	name string
	fn   func(ctx context.Context) error
}

// monitor runs the instance's health checks on a ticker, reports the result
// on the probe socket, and pings systemd's watchdog only while every check
// passes: a primary that cannot serve (journal not writable, API not
// answering, kernel not reachable) or is frozen stops pinging and is
// killed by systemd, and the standby takes over.
type monitor struct {
	log      *slog.Logger
	interval time.Duration // between rounds; half the watchdog interval under systemd
	timeout  time.Duration // per check
	watchdog bool          // ping WATCHDOG=1 after each healthy round
	notify   func(state string) error
	report   func(health string) // sets the probe's health

	mu      sync.Mutex
	checks  []healthCheck
	running map[string]time.Time // checks still running from an earlier round
}

// newMonitor reads WATCHDOG_USEC (and WATCHDOG_PID) like systemd's
// sd_watchdog_enabled: with the watchdog on, rounds run at half its interval.
func newMonitor(log *slog.Logger, report func(string)) *monitor {
	m := &monitor{
		log: log, interval: 5 * time.Second, timeout: 5 * time.Second, report: report,
		notify:  func(s string) error { _, err := daemon.SdNotify(false, s); return err },
		running: map[string]time.Time{},
	}
	if iv, err := daemon.SdWatchdogEnabled(false); err == nil && iv > 0 {
		m.watchdog = true
		m.interval = iv / 2
		// A check may take at most the rest of the interval, so a healthy
		// round still pings in time.
		m.timeout = min(m.timeout, iv/3)
	}
	return m
}

// set replaces the checks (on a change of role); nil means the current
// phase has no checks of its own and the instance counts as healthy while
// its event loop runs.
func (m *monitor) set(checks ...healthCheck) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.checks = checks
}

// run does a round at once and then every interval, until ctx ends.
func (m *monitor) run(ctx context.Context) {
	t := time.NewTicker(m.interval)
	defer t.Stop()
	for {
		m.round(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// round runs every check in parallel, each bounded by the timeout, reports
// the health and pings the watchdog if all passed.
func (m *monitor) round(ctx context.Context) error {
	m.mu.Lock()
	checks := m.checks
	m.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	errs := make([]error, len(checks))
	var wg sync.WaitGroup
	for i, c := range checks {
		m.mu.Lock()
		since, busy := m.running[c.name]
		if !busy {
			m.running[c.name] = time.Now()
		}
		m.mu.Unlock()
		if busy {
			errs[i] = fmt.Errorf("%s: no answer for %v", c.name, time.Since(since).Round(time.Millisecond))
			continue
		}
		res := make(chan error, 1)
		go func() {
			err := c.fn(cctx)
			m.mu.Lock()
			delete(m.running, c.name)
			m.mu.Unlock()
			res <- err
		}()
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case err := <-res:
				if err != nil {
					errs[i] = fmt.Errorf("%s: %w", c.name, err)
				}
			case <-cctx.Done():
				errs[i] = fmt.Errorf("%s: no answer within %v", c.name, m.timeout)
			}
		}()
	}
	wg.Wait()
	err := errors.Join(errs...)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		m.report("unhealthy: " + strings.ReplaceAll(err.Error(), "\n", "; "))
		m.log.Warn("health check failed: not pinging the watchdog", "err", err)
		return err
	}
	if len(checks) > 0 {
		m.report("ok")
	}
	if m.watchdog {
		if err := m.notify(daemon.SdNotifyWatchdog); err != nil {
			m.log.Warn("ping watchdog", "err", err)
		}
	}
	return nil
}
