package e2e

import (
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/ha"
	"github.com/ctld/ctld/internal/testutil"
)

// watchdog stands in for systemd's watchdog (WatchdogSec) for one
// instance: its notify socket, and a SIGKILL when pings stop for longer
// than the interval (systemd sends SIGABRT, then SIGKILL; a stopped process
// only reacts to the SIGKILL).
type watchdog struct {
	sock     string
	interval time.Duration
	mu       sync.Mutex
	pings    int
	last     time.Time
	killed   time.Time
	conn     *net.UnixConn
}

func newWatchdog(t *testing.T, interval time.Duration) *watchdog {
	t.Helper()
	w := &watchdog{sock: filepath.Join(testutil.SocketDir(t), "notify.sock"), interval: interval}
	var err error
	w.conn, err = net.ListenUnixgram("unixgram", &net.UnixAddr{Name: w.sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.conn.Close() })
	return w
}

func (w *watchdog) env() []string {
	return []string{"NOTIFY_SOCKET=" + w.sock, "WATCHDOG_USEC=" + strconv.FormatInt(w.interval.Microseconds(), 10)}
}

// supervise counts pings and kills cmd once they stop for the interval.
// As under systemd, the watchdog is armed when the service is started
// (READY=1), not while the binary is still loading.
func (w *watchdog) supervise(cmd *exec.Cmd) {
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := w.conn.Read(buf)
			if err != nil {
				return
			}
			msg := string(buf[:n])
			w.mu.Lock()
			if strings.Contains(msg, "READY=1") && w.last.IsZero() {
				w.last = time.Now()
			}
			if strings.Contains(msg, "WATCHDOG=1") {
				w.pings++
				w.last = time.Now()
			}
			w.mu.Unlock()
		}
	}()
	go func() {
		for {
			time.Sleep(100 * time.Millisecond)
			w.mu.Lock()
			late := !w.last.IsZero() && time.Since(w.last) > w.interval
			if late {
				w.killed = time.Now()
			}
			w.mu.Unlock()
			if late {
				_ = cmd.Process.Signal(syscall.SIGKILL)
				return
			}
		}
	}()
}

func (w *watchdog) state() (pings int, last, killed time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pings, w.last, w.killed
}

// statusRow is one slot of `ctld status --json`.
type statusRow struct {
	Slot   string     `json:"slot"`
	Status *ha.Status `json:"status"`
	Error  string     `json:"error"`
}

// status runs `ctld status --json`.
func (e *env) status(t *testing.T) []statusRow {
	t.Helper()
	out, err := exec.Command(e.bin, "status", "--json", "--state-dir", e.stateDir, "--run-dir", e.runDir).Output()
	if err != nil {
		t.Fatalf("ctld status: %v", err)
	}
	var st struct {
		Slots []statusRow `json:"slots"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("ctld status: %v: %s", err, out)
	}
	return st.Slots
}

func primaries(rows []statusRow) (out []string) {
	for _, r := range rows {
		if r.Status != nil && r.Status.Role == ha.RolePrimary {
			out = append(out, r.Slot)
		}
	}
	return out
}

// startWatched starts both instances under emulated systemd watchdogs and
// claims a guest on a.
func startWatched(t *testing.T, e *env, interval time.Duration) (wa, wb *watchdog, na api.Node) {
	wa, wb = newWatchdog(t, interval), newWatchdog(t, interval)
	t.Cleanup(func() {
		if t.Failed() {
			for slot, w := range map[string]*watchdog{"a": wa, "b": wb} {
				p, last, killed := w.state()
				t.Logf("watchdog of ctld@%s: %d pings, last %v, killed %v", slot, p, last.Format(time.StampMilli), killed.Format(time.StampMilli))
			}
		}
	})
	e.start("a", wa.env()...)
	wa.supervise(e.procs["a"])
	na = e.waitPrimary("a", 60*time.Second)
	e.start("b", wb.env()...)
	wb.supervise(e.procs["b"])
	e.waitRole("b", ha.RoleStandby, time.Minute)
	return wa, wb, na
}

// afterKill checks the standby took over from the killed primary a and
// still runs the guest claimed before.
func afterKill(t *testing.T, e *env, wa, wb *watchdog, na api.Node, stopped time.Time) {
	t.Helper()
	e.waitExit("a", 60*time.Second)
	_, _, killed := wa.state()
	nb := e.waitPrimary("b", 60*time.Second)
	t.Logf("pings stopped %v; killed by the watchdog after %v; standby serving %v after the kill",
		stopped.Format(time.TimeOnly), killed.Sub(stopped).Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
	if nb.Epoch <= na.Epoch {
		t.Fatalf("epoch after takeover %d, want > %d", nb.Epoch, na.Epoch)
	}
	cx := ctx(t, 2*time.Minute)
	r, err := e.client().Exec(cx, "watched", api.ExecRequest{Args: []string{"/bin/cat", "/tmp/mark"}})
	if err != nil || strings.TrimSpace(string(r.Stdout)) != "before" {
		t.Fatalf("guest after the takeover: %q, %v (it must have kept running)", r.Stdout, err)
	}
	if p, _, k := wb.state(); p == 0 || !k.IsZero() {
		t.Fatalf("standby b: %d pings, killed %v: a healthy standby pings and lives", p, k)
	}
	if _, err := e.client().Release(cx, "watched", api.ReleaseRequest{OperationID: "release-watched", Generation: 1}); err != nil {
		t.Fatal(err)
	}
}

func claimWatched(t *testing.T, e *env) {
	t.Helper()
	cx := ctx(t, 3*time.Minute)
	if _, err := e.client().Claim(cx, "watched", claimReq("claim-watched", 1)); err != nil {
		t.Fatalf("claim: %v", err)
	}
	if _, err := e.client().Exec(cx, "watched", api.ExecRequest{Args: []string{"/bin/sh", "-c", "echo before > /tmp/mark"}}); err != nil {
		t.Fatal(err)
	}
}

// TestWatchdogKillsFrozenPrimary: the primary is frozen (SIGSTOP) with a
// guest running. Its socket still accepts but nobody answers: `ctld status`
// shows it down and the standby as standby (never two primaries), its
// watchdog pings stop, the supervisor kills it, and the standby takes over
// and re-adopts the guest.
func TestWatchdogKillsFrozenPrimary(t *testing.T) {
	e := newEnv(t)
	wa, wb, na := startWatched(t, e, 10*time.Second)
	claimWatched(t, e)
	if p, _, _ := wa.state(); p == 0 {
		t.Fatal("the primary never pinged its watchdog")
	}
	if err := e.procs["a"].Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	rows := e.status(t)
	t.Logf("ctld status with a frozen: %+v", rows)
	if rows[0].Status != nil || rows[1].Status == nil || rows[1].Status.Role != ha.RoleStandby {
		t.Fatalf("status with a frozen primary: a %+v %s, b %+v %s; want a down and b standby", rows[0].Status, rows[0].Error, rows[1].Status, rows[1].Error)
	}
	afterKill(t, e, wa, wb, na, stopped)
	if got := primaries(e.status(t)); len(got) != 1 || got[0] != "b" {
		t.Fatalf("status after the takeover: primaries %v, want [b]", got)
	}
}

// TestWatchdogKillsPrimaryThatCannotServe: the primary's API socket is
// removed, so no client can reach it although the process runs. Its health
// check fails (reported on the probe), it stops pinging, the supervisor
// kills it and the standby takes over and serves a new socket.
func TestWatchdogKillsPrimaryThatCannotServe(t *testing.T) {
	e := newEnv(t)
	wa, wb, na := startWatched(t, e, 10*time.Second)
	claimWatched(t, e)
	if err := os.Remove(filepath.Join(e.runDir, "ctld.sock")); err != nil {
		t.Fatal(err)
	}
	removed := time.Now()
	var health string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, _, killed := wa.state()
		cx := ctx(t, time.Second)
		if st, err := ha.Probe(cx, filepath.Join(e.runDir, "ctld-a.sock")); err == nil && strings.Contains(st.Health, "api") {
			health = st.Health
		}
		if !killed.IsZero() {
			break
		}
		if time.Now().After(deadline) {
			pings, last, _ := wa.state()
			t.Fatalf("the primary that cannot serve was not killed within 30s (pings %d, last %v ago, health %q)", pings, time.Since(last), health)
		}
	}
	if health == "" {
		t.Error("the probe never reported the failing api check")
	}
	t.Logf("probe health before the kill: %s", health)
	_, last, _ := wa.state()
	afterKill(t, e, wa, wb, na, last)
	t.Logf("API socket removed at %v", removed.Format(time.TimeOnly))
}
