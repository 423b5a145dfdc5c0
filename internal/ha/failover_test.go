package ha

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/journal"
	"github.com/ctld/ctld/internal/testutil"
)

// The failover test re-executes this test binary as ctld-like instances:
// with helperEnv set, TestMain runs one Elector + probe server and exits.
const (
	helperEnv      = "CTLD_HA_TEST_HELPER"
	helperStateEnv = "CTLD_HA_TEST_STATE"
	helperSockEnv  = "CTLD_HA_TEST_SOCK"
)

func TestMain(m *testing.M) {
	if slot := os.Getenv(helperEnv); slot != "" {
		os.Exit(runHelper(slot, os.Getenv(helperStateEnv), os.Getenv(helperSockEnv)))
	}
	os.Exit(m.Run())
}

// runHelper is a minimal instance: serve the probe as standby, wait for the
// lock, report primary, and on SIGTERM stop reporting primary before
// releasing the lock (so no two probes ever say primary at once).
func runHelper(slot, stateDir, sock string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	var mu sync.Mutex
	st := Status{Slot: slot, Role: RoleStandby, Health: "ok", PID: os.Getpid(), Since: time.Now()}
	status := func() Status { mu.Lock(); defer mu.Unlock(); return st }

	ln, err := ListenUnix(sock, 0o600, -1)
	if err != nil {
		log.Error("listen probe", "err", err)
		return 2
	}
	served := make(chan error, 1)
	go func() { served <- ServeProbe(ctx, ln, status, log) }()

	term, err := (&Elector{StateDir: stateDir, Slot: slot, Logger: log}).WaitPrimary(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return 0
		}
		log.Error("wait primary", "err", err)
		return 3
	}
	// As ctld: starting until the journal is taken over at the term's
	// epoch, primary only then; stopping until the journal is closed.
	mu.Lock()
	st.Role, st.Epoch, st.Since = RoleStarting, term.Epoch, term.Since
	mu.Unlock()
	j, err := journal.Open(filepath.Join(stateDir, "journal.db"), 5*time.Second)
	if err != nil {
		log.Error("open journal", "err", err)
		return 6
	}
	if err := j.TakeOver(term.Epoch); err != nil {
		log.Error("take journal over", "err", err)
		return 7
	}
	if err := j.Heartbeat(time.Now()); err != nil {
		log.Error("journal heartbeat", "err", err)
		return 8
	}
	mu.Lock()
	st.Role = RolePrimary
	mu.Unlock()

	<-ctx.Done()
	mu.Lock()
	st.Role = RoleStopping
	mu.Unlock()
	if err := j.Close(); err != nil {
		log.Error("close journal", "err", err)
		return 9
	}
	mu.Lock()
	st.Role = RoleStandby
	mu.Unlock()
	if err := term.Release(); err != nil {
		log.Error("release", "err", err)
		return 4
	}
	if err := <-served; err != nil {
		log.Error("serve probe", "err", err)
		return 5
	}
	return 0
}

type instance struct {
	slot, sock string
	cmd        *exec.Cmd
	done       chan struct{}
	waitErr    error
	stopped    bool // by the test; any other exit is a failure
}

func (in *instance) running() bool {
	if in.cmd == nil {
		return false
	}
	select {
	case <-in.done:
		return false
	default:
		return true
	}
}

func (in *instance) start(t *testing.T, stateDir string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+in.slot, helperStateEnv+"="+stateDir, helperSockEnv+"="+in.sock)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start instance %s: %v", in.slot, err)
	}
	in.cmd, in.done, in.waitErr, in.stopped = cmd, make(chan struct{}), nil, false
	go func() { in.waitErr = cmd.Wait(); close(in.done) }()
}

// stop sends sig and waits for the process to be reaped, so a dead instance
// can no longer answer a probe.
func (in *instance) stop(t *testing.T, sig syscall.Signal) {
	t.Helper()
	in.stopped = true
	if err := in.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatalf("signal %s: %v", in.slot, err)
	}
	select {
	case <-in.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("instance %s did not exit after %v", in.slot, sig)
	}
	if sig == syscall.SIGTERM && in.waitErr != nil {
		t.Fatalf("instance %s after SIGTERM: %v (graceful stop must exit 0)", in.slot, in.waitErr)
	}
}

// TestFailoverRandomized kills, stops and restarts two instances at random
// and checks, after every round, that there is never more than one primary,
// that a new primary always has a higher epoch than any seen before, that a
// surviving primary keeps its term (no failback), and that the lock file is
// never replaced.
func TestFailoverRandomized(t *testing.T) {
	const rounds = 200
	stateDir := t.TempDir()
	sockDir := testutil.SocketDir(t)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))

	insts := []*instance{
		{slot: "a", sock: filepath.Join(sockDir, "ctld-a.sock")},
		{slot: "b", sock: filepath.Join(sockDir, "ctld-b.sock")},
	}
	t.Cleanup(func() {
		for _, in := range insts {
			if in.running() {
				_ = in.cmd.Process.Kill()
				<-in.done
			}
		}
	})
	for _, in := range insts {
		in.start(t, stateDir)
	}
	// Every round settles until each running instance answers its probe, so
	// its SIGTERM handler is installed before any signal arrives.
	first := settle(t, insts, "start")

	var (
		lockIno                         uint64
		lastPrimary                     = first
		maxEpoch                        = first.Epoch
		maxTakeover                     time.Duration
		kills, terms, starts, takeovers int
	)
	for round := range rounds {
		in := insts[rng.IntN(len(insts))]
		action := "start"
		if in.running() {
			if rng.IntN(2) == 0 {
				action = "kill -9"
				kills++
				in.stop(t, syscall.SIGKILL)
			} else {
				action = "SIGTERM"
				terms++
				in.stop(t, syscall.SIGTERM)
			}
			if rng.IntN(2) == 0 {
				action += "+restart"
				in.start(t, stateDir)
				starts++
			}
		} else {
			in.start(t, stateDir)
			starts++
		}
		acted := time.Now()
		where := fmt.Sprintf("round %d (%s %s)", round, action, in.slot)

		primary := settle(t, insts, where)
		for _, other := range insts {
			if other.cmd != nil && !other.running() && !other.stopped {
				t.Fatalf("%s: instance %s exited by itself: %v", where, other.slot, other.waitErr)
			}
		}
		if primary.PID == 0 {
			continue // both down: nothing to compare
		}
		if primary.PID != lastPrimary.PID {
			takeovers++
			if primary.Epoch <= maxEpoch {
				t.Fatalf("%s: new primary %s (pid %d) has epoch %d, not above earlier max %d", where, primary.Slot, primary.PID, primary.Epoch, maxEpoch)
			}
			if d := time.Since(acted); d > maxTakeover {
				maxTakeover = d
			}
		} else if primary.Epoch != lastPrimary.Epoch {
			t.Fatalf("%s: primary pid %d changed epoch %d -> %d within one term", where, primary.PID, lastPrimary.Epoch, primary.Epoch)
		}
		// No failback: a primary that is still alive stays primary.
		if lastPrimary.PID != 0 && primary.PID != lastPrimary.PID {
			for _, other := range insts {
				if other.running() && other.cmd.Process.Pid == lastPrimary.PID {
					t.Fatalf("%s: primary moved from live pid %d to pid %d", where, lastPrimary.PID, primary.PID)
				}
			}
		}
		maxEpoch = max(maxEpoch, primary.Epoch)
		lastPrimary = primary
		if onDisk, err := ReadEpoch(stateDir); err != nil || onDisk != primary.Epoch {
			t.Fatalf("%s: epoch file = %d, %v; primary reports %d", where, onDisk, err, primary.Epoch)
		}
		ino := lockInode(t, stateDir)
		if lockIno == 0 {
			lockIno = ino
		} else if ino != lockIno {
			t.Fatalf("%s: lock file inode changed %d -> %d", where, lockIno, ino)
		}
	}
	t.Logf("%d rounds: %d kill -9, %d SIGTERM, %d starts, %d takeovers, final epoch %d, slowest settle after a takeover %v",
		rounds, kills, terms, starts, takeovers, maxEpoch, maxTakeover)
	for _, in := range insts {
		if in.running() {
			in.stop(t, syscall.SIGTERM)
		}
	}
	// Every term took the journal over at its epoch, so it carries the
	// last one (the standby may have taken a last term as they stopped).
	last, err := ReadEpoch(stateDir)
	if err != nil || last < maxEpoch {
		t.Fatalf("durable epoch %d, %v; want at least %d", last, err, maxEpoch)
	}
	j, err := journal.Open(filepath.Join(stateDir, "journal.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if e, err := j.Epoch(); err != nil || e != last {
		t.Fatalf("journal epoch %d, %v; want the last term's %d", e, err, last)
	}
	if takeovers < rounds/10 {
		t.Fatalf("only %d takeovers in %d rounds: the test did not exercise failover", takeovers, rounds)
	}
}

// settle polls every running instance until all answer and exactly one is
// primary (none if nobody runs), failing on any snapshot with two primaries.
// It returns the primary's status (zero if none).
func settle(t *testing.T, insts []*instance, where string) Status {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		var primaries []Status
		answered, live := 0, 0
		for _, in := range insts {
			if !in.running() {
				continue
			}
			live++
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			st, err := Probe(ctx, in.sock)
			cancel()
			if err != nil {
				last = fmt.Sprintf("%s: %v", in.slot, err)
				continue
			}
			if st.PID != in.cmd.Process.Pid {
				// The dead predecessor's socket cannot answer, so this is
				// the new process mid-startup; wait for its own answer.
				last = fmt.Sprintf("%s: answered by pid %d, want %d", in.slot, st.PID, in.cmd.Process.Pid)
				continue
			}
			answered++
			if st.Role == RolePrimary {
				primaries = append(primaries, st)
			}
		}
		if len(primaries) > 1 {
			t.Fatalf("%s: two primaries at once: %+v", where, primaries)
		}
		if answered == live && len(primaries) == min(live, 1) {
			if len(primaries) == 1 {
				return primaries[0]
			}
			return Status{}
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("%s: did not settle to one primary within 10s (last: %s)", where, last)
	return Status{}
}
