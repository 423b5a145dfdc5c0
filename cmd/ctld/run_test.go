package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ctld/ctld/internal/ha"
	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/testutil"
)

// supervisor stands in for systemd's end of NOTIFY_SOCKET.
type supervisor struct {
	conn *net.UnixConn
}

func newSupervisor(t *testing.T, watchdog time.Duration) *supervisor {
	t.Helper()
	path := filepath.Join(testutil.SocketDir(t), "notify.sock")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	t.Setenv("WATCHDOG_USEC", strconv.FormatInt(watchdog.Microseconds(), 10))
	os.Unsetenv("WATCHDOG_PID")
	return &supervisor{conn: c}
}

// pings counts WATCHDOG=1 messages received within d.
func (s *supervisor) pings(t *testing.T, d time.Duration) int {
	t.Helper()
	n := 0
	deadline := time.Now().Add(d)
	buf := make([]byte, 4096)
	for {
		s.conn.SetReadDeadline(deadline)
		k, err := s.conn.Read(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return n
		}
		if err != nil {
			t.Fatalf("read notify socket: %v", err)
		}
		if strings.Contains(string(buf[:k]), "WATCHDOG=1") {
			n++
		}
	}
}

// TestWatchdogPingsOnlyWhileHealthy: the watchdog is pinged after healthy
// rounds only; a failing check, or one that hangs, stops the pings (systemd
// then kills the instance) and the probe's health says why; they resume
// when the check passes again.
func TestWatchdogPingsOnlyWhileHealthy(t *testing.T) {
	sup := newSupervisor(t, 300*time.Millisecond)
	var health atomic.Value
	health.Store("")
	m := newMonitor(slog.New(slog.DiscardHandler), func(h string) { health.Store(h) })
	if !m.watchdog || m.interval != 150*time.Millisecond {
		t.Fatalf("monitor watchdog %v interval %v, want on at 150ms", m.watchdog, m.interval)
	}
	var failing atomic.Bool
	hang := make(chan struct{})
	var hanging atomic.Bool
	m.set(healthCheck{"journal", func(ctx context.Context) error {
		if hanging.Load() {
			<-hang // a syscall that ignores ctx
		}
		if failing.Load() {
			return errors.New("disk gone")
		}
		return nil
	}})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); m.run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })

	if n := sup.pings(t, time.Second); n < 4 {
		t.Fatalf("healthy: %d pings in 1s, want at least 4 (every 150ms)", n)
	}
	if h := health.Load(); h != "ok" {
		t.Fatalf("healthy: probe health %q, want ok", h)
	}
	failing.Store(true)
	sup.pings(t, 300*time.Millisecond) // a round in flight may still ping
	if n := sup.pings(t, time.Second); n != 0 {
		t.Fatalf("failing check: %d pings in 1s, want none", n)
	}
	if h := health.Load().(string); !strings.Contains(h, "unhealthy") || !strings.Contains(h, "disk gone") {
		t.Fatalf("failing check: probe health %q, want unhealthy with the reason", h)
	}
	failing.Store(false)
	if n := sup.pings(t, time.Second); n < 3 {
		t.Fatalf("recovered: %d pings in 1s, want them back", n)
	}
	hanging.Store(true)
	sup.pings(t, 300*time.Millisecond)
	if n := sup.pings(t, time.Second); n != 0 {
		t.Fatalf("hanging check: %d pings in 1s, want none", n)
	}
	if h := health.Load().(string); !strings.Contains(h, "journal: no answer") {
		t.Fatalf("hanging check: probe health %q, want no answer", h)
	}
	hanging.Store(false)
	close(hang)
	if n := sup.pings(t, time.Second); n < 3 {
		t.Fatalf("after the hang: %d pings in 1s, want them back", n)
	}
}

// takeover runs one instance's run() in this process until it returns,
// recording every role its probe reported.
func takeover(t *testing.T, stateDir string) (roles map[ha.Role]int, err error) {
	t.Helper()
	runDir := testutil.SocketDir(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	o := runOpts{slot: "a", journalTimeout: time.Second, takeoverLimit: time.Minute, drainTimeout: time.Second, runsc: filepath.Join(runDir, "no-runsc")}
	errc := make(chan error, 1)
	go func() {
		errc <- runInstance(ctx, globalOpts{stateDir: stateDir, runDir: runDir}, o, slog.New(slog.DiscardHandler))
	}()
	roles = map[ha.Role]int{}
	for {
		select {
		case err := <-errc:
			return roles, err
		case <-time.After(10 * time.Second):
			t.Fatal("run did not return within 10s")
		default:
		}
		pctx, pcancel := context.WithTimeout(ctx, 100*time.Millisecond)
		if st, err := ha.Probe(pctx, probePath(runDir, "a")); err == nil {
			roles[st.Role]++
		}
		pcancel()
		time.Sleep(2 * time.Millisecond)
	}
}

func lockIsFree(t *testing.T, stateDir string) {
	t.Helper()
	f, err := os.OpenFile(ha.LockPath(stateDir), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatalf("primary lock still held after the takeover gave up: %v", err)
	}
}

// TestTakeoverGivesUpWhenJournalHeld: a new primary that cannot open the
// journal (another process holds it) gives the role and the lock back
// without its probe ever saying primary, so status never shows two.
func TestTakeoverGivesUpWhenJournalHeld(t *testing.T) {
	stateDir := t.TempDir()
	holder, err := journal.Open(filepath.Join(stateDir, "journal.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	roles, err := takeover(t, stateDir)
	t.Logf("roles seen: %v; run: %v", roles, err)
	if err == nil || !strings.Contains(err.Error(), "open journal") {
		t.Fatalf("run = %v, want an error opening the journal", err)
	}
	if roles[ha.RolePrimary] != 0 {
		t.Fatalf("probe said primary %d times while the journal could not be opened", roles[ha.RolePrimary])
	}
	if roles[ha.RoleStarting] == 0 {
		t.Fatal("never saw the takeover (role starting): the test proves nothing")
	}
	lockIsFree(t, stateDir)
}

// TestTakeoverRefusesRolledBackEpoch: ha/epoch behind the journal's epoch
// (the epoch file was restored from a backup) must not start a term.
func TestTakeoverRefusesRolledBackEpoch(t *testing.T) {
	stateDir := t.TempDir()
	j, err := journal.Open(filepath.Join(stateDir, "journal.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := j.TakeOver(10); err != nil {
		t.Fatal(err)
	}
	j.Close()
	if err := os.MkdirAll(filepath.Join(stateDir, "ha"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ha.EpochPath(stateDir), []byte("3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	roles, err := takeover(t, stateDir)
	if !errors.Is(err, journal.ErrEpochBehind) || !strings.Contains(err.Error(), "rolled back") {
		t.Fatalf("run = %v, want ErrEpochBehind saying the epoch file was rolled back", err)
	}
	if roles[ha.RolePrimary] != 0 {
		t.Fatalf("probe said primary with a rolled-back epoch")
	}
	lockIsFree(t, stateDir)
	j, err = journal.Open(filepath.Join(stateDir, "journal.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if e, err := j.Epoch(); err != nil || e != 10 {
		t.Fatalf("journal epoch after the refused term = %d, %v; want 10", e, err)
	}
}

// TestLostLockEndsTheTerm: when the lock no longer excludes (its file was
// replaced), the primary's lock check fails and ends the term at once.
func TestLostLockEndsTheTerm(t *testing.T) {
	stateDir := t.TempDir()
	term, err := (&ha.Elector{StateDir: stateDir, Slot: "a"}).WaitPrimary(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer term.Release()
	j, err := journal.Open(filepath.Join(stateDir, "journal.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if err := j.TakeOver(term.Epoch); err != nil {
		t.Fatal(err)
	}
	termCtx, endTerm := context.WithCancelCause(context.Background())
	checks := primaryChecks(term, j, filepath.Join(testutil.SocketDir(t), "none.sock"), t.TempDir(), endTerm)
	run := func(name string) error {
		for _, c := range checks {
			if c.name == name {
				return c.fn(context.Background())
			}
		}
		t.Fatalf("no check %s", name)
		return nil
	}
	for _, name := range []string{"lock", "journal"} {
		if err := run(name); err != nil {
			t.Fatalf("%s check while the term holds: %v", name, err)
		}
	}
	if err := run("api"); err == nil {
		t.Fatal("api check passed without an API socket")
	}
	if termCtx.Err() != nil {
		t.Fatal("a failing api check ended the term; only a lost lock or journal does")
	}
	if err := os.Remove(ha.LockPath(stateDir)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ha.LockPath(stateDir), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run("lock"); err == nil {
		t.Fatal("lock check passed with the lock file replaced")
	}
	if !errors.Is(context.Cause(termCtx), errTermLost) {
		t.Fatalf("term after a lost lock: %v, want ended with errTermLost", context.Cause(termCtx))
	}
}
