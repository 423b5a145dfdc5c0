package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/testutil"
)

// TestMain lets a test run this binary as ctl-manager itself: a real
// child process that a test can SIGKILL.
func TestMain(m *testing.M) {
	if os.Getenv("CTL_MANAGER_TEST_CHILD") == "1" {
		main()
	}
	os.Exit(m.Run())
}

// serveChild is `ctl-manager serve` in a child process.
type serveChild struct {
	t    *testing.T
	cmd  *exec.Cmd
	addr string
	log  *testutil.Buffer // its stderr
}

// startServeChild starts `ctl-manager serve` as a child process on addr
// ("127.0.0.1:0": any port) and waits until it serves.
func (e *env) startServeChild(addr string, args ...string) *serveChild {
	e.t.Helper()
	// An empty configuration: no block store (volumes are not used here).
	cfg := e.t.TempDir() + "/ctld.toml"
	if err := os.WriteFile(cfg, nil, 0o644); err != nil {
		e.t.Fatal(err)
	}
	full := append([]string{"--socket", e.socket, "--db", e.db, "serve", "--listen", addr, "--config", cfg}, args...)
	cmd := exec.Command(os.Args[0], full...)
	cmd.Env = append(os.Environ(), "CTL_MANAGER_TEST_CHILD=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	c := &serveChild{t: e.t, cmd: cmd, log: &testutil.Buffer{}}
	cmd.Stderr = c.log
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		if c.cmd.ProcessState == nil {
			c.cmd.Process.Kill()
			c.cmd.Wait()
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		e.t.Fatalf("serve printed nothing: %v\n%s", err, c.stderr())
	}
	c.addr = strings.TrimSpace(strings.TrimPrefix(line, "serving on http://"))
	return c
}

func (c *serveChild) stderr() string { return c.log.String() }

// kill SIGKILLs the process and reaps it.
func (c *serveChild) kill() {
	c.t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		c.t.Fatal(err)
	}
	err := c.cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		c.t.Fatalf("serve did not die of SIGKILL: %v", err)
	}
}

// gate holds the node's first call of a kind at a point (before it is
// carried out, or after, before its answer) until released with the
// answer it should give; later calls pass.
type gate struct {
	kind    string
	after   bool
	arrived chan string
	release chan error
	once    sync.Once
}

func newGate(kind string, after bool) *gate {
	return &gate{kind: kind, after: after, arrived: make(chan string, 1), release: make(chan error)}
}

func (g *gate) hold(kind, id string, after bool) error {
	if kind != g.kind || after != g.after {
		return nil
	}
	held := false
	g.once.Do(func() { held = true })
	if !held {
		return nil
	}
	g.arrived <- id
	return <-g.release
}

// TestServeSIGKILLMidOperation: a real `ctl-manager serve` process is
// SIGKILLed while the node holds its call (a create the node did, one it
// never took, a destroy, a timeout's release) and started again on the
// same database. Once the dead process's operation leases expire (a 1s
// TTL here), the new one takes them over and every operation completes
// exactly once: one claim or release operation id per sandbox on the
// node (the create the node never took is claimed with the operation id
// recorded for it, within the create timeout), the owner's quota use
// right, the timeout's timer done.
func TestServeSIGKILLMidOperation(t *testing.T) {
	e := newEnv(t)
	key := strings.TrimSpace(e.ok("key", "create", "--owner", "team-a"))
	ctx := context.Background()
	child := e.startServeChild("127.0.0.1:0", "--template", "busybox", "--default-timeout", "0", "--lease-ttl", "1s")
	addr := child.addr
	c := &client.Client{BaseURL: "http://" + addr, Key: key}
	restart := func() {
		t.Helper()
		child.kill()
		// The same port: a listener's address is reusable at once.
		if ln, err := net.Listen("tcp", addr); err != nil {
			t.Fatalf("port %s not free after the kill: %v", addr, err)
		} else {
			ln.Close()
		}
		child = e.startServeChild(addr, "--template", "busybox", "--default-timeout", "0", "--lease-ttl", "1s")
	}
	setHold := func(g *gate) {
		e.node.Lock()
		e.node.Hold = g.hold
		e.node.Unlock()
	}
	// asyncCreate starts a create whose answer the kill cuts off.
	asyncCreate := func(label string) chan error {
		done := make(chan error, 1)
		go func() {
			_, err := c.Create(ctx, client.CreateRequest{Template: "busybox", Labels: map[string]string{"case": label}})
			done <- err
		}()
		return done
	}
	byLabel := func(label string) client.Sandbox {
		t.Helper()
		l, err := c.List(ctx, client.ListOptions{Labels: map[string]string{"case": label}})
		if err != nil || len(l.Sandboxes) != 1 {
			t.Fatalf("sandboxes of case %s: %+v, %v", label, l, err)
		}
		return l.Sandboxes[0]
	}
	waitFor := func(id, state string) client.Sandbox {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			sb, err := c.Get(ctx, id)
			if err == nil && sb.State == state && (state == client.StateReady || sb.Reason != "") {
				return sb
			}
			if time.Now().After(deadline) {
				t.Fatalf("sandbox %s: %+v, %v; want %s\nserve's log:\n%s", id, sb, err, state, child.stderr())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	// 1. Mid-create, after the node made the sandbox: completed, once.
	g := newGate("claim", true)
	setHold(g)
	done := asyncCreate("did")
	id1 := <-g.arrived
	restart()
	g.release <- nil // the node's answer goes to a dead connection
	if err := <-done; err == nil {
		t.Fatal("the create answered although its server was killed")
	}
	waitFor(id1, client.StateReady)
	if sb := byLabel("did"); sb.ID != id1 {
		t.Fatalf("case did: %+v, want %s", sb, id1)
	}

	// 2. Mid-create, the node never took the claim: completed by the
	// next server with the operation id recorded for it.
	g = newGate("claim", false)
	setHold(g)
	done = asyncCreate("dropped")
	id2 := <-g.arrived
	restart()
	g.release <- errdefs.Errorf(errdefs.CodeUnavailable, "the caller is gone")
	<-done
	waitFor(id2, client.StateReady)

	// 3. Mid-destroy, after the node released it: the retried destroy
	// sends the same operation id and answers the proof.
	sb3, err := c.Create(ctx, client.CreateRequest{Template: "busybox", Labels: map[string]string{"case": "destroy"}})
	if err != nil {
		t.Fatal(err)
	}
	g = newGate("release", true)
	setHold(g)
	ddone := make(chan error, 1)
	go func() { _, err := c.Destroy(ctx, sb3.ID); ddone <- err }()
	<-g.arrived
	restart()
	g.release <- nil
	if err := <-ddone; err == nil {
		t.Fatal("the destroy answered although its server was killed")
	}
	// Until the dead server's lease on the destroy expires, a retry is
	// told to come back (503 with Retry-After); then it answers the proof.
	var d client.DestroyResult
	for deadline := time.Now().Add(10 * time.Second); ; {
		var ce *client.Error
		d, err = c.Destroy(ctx, sb3.ID)
		if !errors.As(err, &ce) || ce.Code != client.CodeUnavailable || ce.RetryAfter <= 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(ce.RetryAfter)
	}
	if err != nil || !d.Proof.Verified || !d.Proof.Clean || d.Sandbox.State != client.StateDestroyed {
		t.Fatalf("destroy after the restart: %+v, %v", d, err)
	}

	// 4. A timeout firing, killed before the node released: the next
	// server completes it.
	g = newGate("release", false)
	setHold(g)
	sb4, err := c.Create(ctx, client.CreateRequest{Template: "busybox", TimeoutSec: 1, Labels: map[string]string{"case": "timeout"}})
	if err != nil {
		t.Fatal(err)
	}
	if id := <-g.arrived; id != sb4.ID {
		t.Fatalf("release of %s held, want %s", id, sb4.ID)
	}
	restart()
	g.release <- nil // the node releases; its answer is lost
	if sb := waitFor(sb4.ID, client.StateDestroyed); sb.Reason != "timeout" {
		t.Fatalf("the timed out sandbox: %+v", sb)
	}

	// Exactly once on the node: one claim operation per sandbox it made
	// (1, 2, 3, 4), one release operation per sandbox released (3, 4).
	e.node.Lock()
	claims, releases := distinct(e.node.ClaimOps), distinct(e.node.ReleaseOps)
	e.node.Unlock()
	if claims != 4 || releases != 2 {
		t.Fatalf("node operations: %d distinct claims, %d distinct releases; want 4 and 2", claims, releases)
	}
	list, err := e.node.List(ctx)
	if err != nil || len(list.Sandboxes) != 4 {
		t.Fatalf("node sandboxes: %+v, %v; want 4", list, err)
	}
	for _, sb := range list.Sandboxes {
		if sb.Generation != 1 {
			t.Fatalf("node sandbox %s at generation %d: claimed twice", sb.ID, sb.Generation)
		}
	}
	if out := e.ok("owner", "quota", "get", "team-a"); !strings.Contains(out, "sandboxes 2/") {
		t.Fatalf("quota use after the crashes: %s (want the two ready sandboxes)", out)
	}
	time.Sleep(200 * time.Millisecond)
	e.node.Lock()
	later := fmt.Sprint(distinct(e.node.ClaimOps), distinct(e.node.ReleaseOps))
	e.node.Unlock()
	if later != "4 2" {
		t.Fatalf("the node got more operations later: %s", later)
	}
	child.kill()
}

func distinct(ops []string) int {
	m := map[string]bool{}
	for _, o := range ops {
		m[o] = true
	}
	return len(m)
}
