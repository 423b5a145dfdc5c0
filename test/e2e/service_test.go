package e2e

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/client"
	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/manager"
	"github.com/ctld/ctld/internal/service"
	"github.com/ctld/ctld/internal/template"
	"github.com/ctld/ctld/internal/testutil"
)

// svc is `ctl-manager serve`'s server run in-process over a real ctld,
// with one owner and its key, and the Go client of that key.
type svc struct {
	store *manager.Store
	c     *client.Client
	url   string
}

// startService serves the API over e's ctld until the test ends (stopped
// before e's own cleanup, so nothing it holds counts as a leak).
func startService(t testing.TB, e *env, tune func(*service.Server)) *svc {
	t.Helper()
	ctx := context.Background()
	st, err := manager.OpenStore(ctx, filepath.Join(t.TempDir(), "manager.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateOwner(ctx, "team-a"); err != nil {
		t.Fatal(err)
	}
	key, _, err := st.CreateKey(ctx, "team-a")
	if err != nil {
		t.Fatal(err)
	}
	logs := &testutil.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	m := &manager.Manager{Store: st, Client: e.client(), Log: log}
	srv := &service.Server{Manager: m, Store: st, Log: log, Templates: []client.Template{{Name: "busybox", Mode: "overlay", Languages: []string{"sh"}}},
		TimerInterval: 100 * time.Millisecond, CreateTimeout: 3 * time.Minute}
	if tune != nil {
		tune(srv)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(sctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
		st.Close()
		if t.Failed() {
			t.Logf("service log:\n%s", logs.String())
		}
	})
	url := "http://" + ln.Addr().String()
	return &svc{store: st, url: url, c: &client.Client{BaseURL: url, Key: key}}
}

// serviceOnCtld starts ctld's slot a and a service over its primary,
// and returns them with an 8-minute context and the node as it was
// before the test's sandboxes (its capacity, to compare with after).
func serviceOnCtld(t *testing.T) (*env, *svc, context.Context, api.Node) {
	t.Helper()
	e := newEnv(t)
	e.start("a")
	e.waitPrimary("a", 2*time.Minute)
	s := startService(t, e, nil)
	cx := ctx(t, 8*time.Minute)
	before, err := e.client().Node(cx)
	if err != nil {
		t.Fatal(err)
	}
	return e, s, cx, before
}

// TestServiceLifetimesOnCtld: the service over a real ctld. A sandbox
// created through the API runs a streamed exec, takes and gives back a
// file, and its destroy returns a verified, clean proof. Another gets a
// short timeout that is then extended: it outlives the first deadline,
// and the extended one destroys it, its release's proof recorded as
// verified in the store, and the node's leased capacity is back to what
// it was before.
func TestServiceLifetimesOnCtld(t *testing.T) {
	e, s, cx, before := serviceOnCtld(t)

	// Both sandboxes are created at once (each claim costs seconds under TCG).
	type created struct {
		sb  client.Sandbox
		err error
	}
	ch := make(chan created, 2)
	for range 2 {
		go func() {
			sb, err := s.c.Create(cx, client.CreateRequest{Template: "busybox", TimeoutSec: 900, Labels: map[string]string{"e2e": "service"}})
			ch <- created{sb, err}
		}()
	}
	var sbs []client.Sandbox
	for range 2 {
		r := <-ch
		if r.err != nil || r.sb.State != client.StateReady {
			t.Fatalf("create: %+v, %v", r.sb, r.err)
		}
		sbs = append(sbs, r.sb)
	}
	work, timed := sbs[0], sbs[1]

	// The timed one: a 4 s timeout, extended at once to 25 s.
	if _, err := s.c.SetTimeout(cx, timed.ID, 4); err != nil {
		t.Fatalf("set timeout 4s: %v", err)
	}
	extendedAt := time.Now() // the new deadline is no sooner than 25 s after this
	ext, err := s.c.SetTimeout(cx, timed.ID, 25)
	if err != nil || ext.EndsAt == nil {
		t.Fatalf("extend to 25s: %+v, %v", ext, err)
	}

	// Past the first deadline (4 s) the extended sandbox still runs.
	if w := 6*time.Second - time.Since(extendedAt); w > 0 {
		time.Sleep(w)
	}
	if sb, err := s.c.Get(cx, timed.ID); err != nil || sb.State != client.StateReady {
		t.Fatalf("after its first deadline the extended sandbox is %+v, %v", sb, err)
	}
	if r, err := s.c.Exec(cx, timed.ID, client.ExecRequest{Args: []string{"true"}}); err != nil || r.ExitCode != 0 {
		t.Fatalf("exec in the extended sandbox: %+v, %v", r, err)
	}
	if d := time.Since(extendedAt); d >= 25*time.Second {
		t.Fatalf("the checks of the extended sandbox ended %v after the extension: too slow to tell it from the extended deadline", d)
	}

	// The other one: exec streamed, files put and get, destroy.
	var out, errb bytes.Buffer
	code, err := s.c.ExecStream(cx, work.ID, client.ExecRequest{Args: []string{"/bin/sh", "-c", "for i in 1 2 3; do echo out$i; echo err$i >&2; done; exit 7"}}, &out, &errb)
	if err != nil || code != 7 || out.String() != "out1\nout2\nout3\n" || errb.String() != "err1\nerr2\nerr3\n" {
		t.Fatalf("exec streamed: code %d, stdout %q, stderr %q, %v", code, out.String(), errb.String(), err)
	}
	payload := bytes.Repeat([]byte("service file\n"), 5000)
	if err := s.c.WriteFile(cx, work.ID, "/tmp/put.txt", bytes.NewReader(payload), int64(len(payload))); err != nil {
		t.Fatalf("put file: %v", err)
	}
	r, err := s.c.Exec(cx, work.ID, client.ExecRequest{Args: []string{"/bin/sh", "-c", "wc -c < /tmp/put.txt"}})
	if err != nil || strings.TrimSpace(string(r.Stdout)) != "65000" {
		t.Fatalf("the guest's size of the put file: %+v, %v", r, err)
	}
	var got bytes.Buffer
	if n, err := s.c.ReadFile(cx, work.ID, "/tmp/put.txt", &got); err != nil || n != int64(len(payload)) || !bytes.Equal(got.Bytes(), payload) {
		t.Fatalf("get file: %d bytes, %v", n, err)
	}
	d, err := s.c.Destroy(cx, work.ID)
	if err != nil || d.Sandbox.State != client.StateDestroyed || !d.Proof.Verified || !d.Proof.Clean || len(d.Proof.Signature) == 0 {
		t.Fatalf("destroy: %+v, %v", d, err)
	}

	// The extended deadline fires: the release is recorded and proven.
	var tm manager.Timer
	for deadline := time.Now().Add(3 * time.Minute); ; {
		tm, err = s.store.Timer(cx, timed.ID)
		if err != nil {
			t.Fatal(err)
		}
		if tm.State == "done" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("timer of %s not done within 3m after its deadline: %+v", timed.ID, tm)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if fired := time.Since(extendedAt); fired < 25*time.Second {
		t.Fatalf("the timeout fired %v after the extension to 25s", fired)
	}
	sb, err := s.c.Get(cx, timed.ID)
	if err != nil || sb.State != client.StateDestroyed || sb.Reason != "timeout" {
		t.Fatalf("after its timeout: %+v, %v", sb, err)
	}
	p, err := s.store.Proof(cx, tm.OperationID)
	if err != nil || !p.Verified || !p.Proof.Clean {
		t.Fatalf("proof of the timeout's release %s: %+v, %v", tm.OperationID, p, err)
	}
	nsb, err := e.client().Get(cx, timed.ID)
	if err != nil || nsb.State != api.StateReleased {
		t.Fatalf("the node's view of the timed-out sandbox: %+v, %v", nsb, err)
	}
	after, err := e.client().Node(cx)
	if err != nil {
		t.Fatal(err)
	}
	if after.Capacity.Leased != before.Capacity.Leased || after.Capacity.Withheld != before.Capacity.Withheld {
		t.Fatalf("capacity after both ended: leased %+v withheld %+v, before leased %+v withheld %+v",
			after.Capacity.Leased, after.Capacity.Withheld, before.Capacity.Leased, before.Capacity.Withheld)
	}
	t.Logf("timeout fired %v after the extension to 25s; proof %s verified", time.Since(extendedAt).Round(time.Millisecond), tm.OperationID)
}

// BenchmarkServiceVsCtld measures what the service adds over ctld's own
// API (issue 23's goals): create→ready through POST /v1/sandboxes against
// a claim on ctld's socket with the same spec (p50 ratio goal <= 1.05),
// CTLD_BENCH_CLAIMS (default 8) each, alternating and each released
// before the next; then the exec round trip of /bin/true on one guest
// through the service against ctld's socket (goal <= 1.1),
// CTLD_BENCH_EXECS (default 50) each, alternating.
// Run: make bench VM_PKGS=./test/e2e BENCH=ServiceVsCtld
func BenchmarkServiceVsCtld(b *testing.B) {
	nc, ne := envInt("CTLD_BENCH_CLAIMS", 8), envInt("CTLD_BENCH_EXECS", 50)
	e := newEnv(b)
	e.start("a")
	e.waitPrimary("a", 2*time.Minute)
	s := startService(b, e, nil)
	c := e.client()
	creq := client.CreateRequest{Template: "busybox", Resources: &client.Resources{CPU: "500m", Memory: "256Mi", PIDs: 128}, Network: &client.Network{Mode: "deny_all"}}
	res := series{}
	for i := range nc {
		sides := []string{"service", "ctld"}
		if i%2 == 1 {
			sides[0], sides[1] = sides[1], sides[0]
		}
		for _, side := range sides {
			cx := ctx(b, 5*time.Minute)
			if side == "service" {
				start := time.Now()
				sb, err := s.c.Create(cx, creq)
				if err != nil || sb.State != client.StateReady {
					b.Fatalf("service create: %+v, %v", sb, err)
				}
				res.add(side, float64(time.Since(start).Microseconds())/1000)
				if d, err := s.c.Destroy(cx, sb.ID); err != nil || !d.Proof.Clean {
					b.Fatalf("service destroy: %+v, %v", d, err)
				}
				continue
			}
			id := fmt.Sprintf("direct-%d", i)
			start := time.Now()
			if _, err := c.Claim(cx, id, claimReq("c-"+id, 1)); err != nil {
				b.Fatalf("claim %s: %v", id, err)
			}
			res.add(side, float64(time.Since(start).Microseconds())/1000)
			if r, err := c.Release(cx, id, api.ReleaseRequest{OperationID: "r-" + id, Generation: 1}); err != nil || !r.Proof.Clean {
				b.Fatalf("release %s: %+v, %v", id, r.Proof, err)
			}
		}
	}
	sb, err := s.c.Create(ctx(b, 5*time.Minute), creq)
	if err != nil {
		b.Fatalf("service create: %v", err)
	}
	req := client.ExecRequest{Args: []string{"/bin/true"}}
	for range ne {
		for _, side := range []string{"service-exec", "ctld-exec"} {
			cx := ctx(b, time.Minute)
			start := time.Now()
			var code int
			var err error
			if side == "service-exec" {
				var r client.ExecResult
				r, err = s.c.Exec(cx, sb.ID, req)
				code = r.ExitCode
			} else {
				var r api.ExecResult
				r, err = c.Exec(cx, sb.ID, api.ExecRequest{Args: req.Args})
				code = r.ExitCode
			}
			if err != nil || code != 0 {
				b.Fatalf("exec /bin/true via %s: %d %v", side, code, err)
			}
			res.add(side, float64(time.Since(start).Microseconds())/1000)
		}
	}
	if d, err := s.c.Destroy(ctx(b, 5*time.Minute), sb.ID); err != nil || !d.Proof.Clean {
		b.Fatalf("service destroy: %+v, %v", d, err)
	}
	s50, c50, se50, ce50 := pct(res["service"], 50), pct(res["ctld"], 50), pct(res["service-exec"], 50), pct(res["ctld-exec"], 50)
	b.Logf("create→ready, n=%d each: service p50 %.0f ms p99 %.0f ms, ctld claim p50 %.0f ms p99 %.0f ms, service/ctld p50 %.3f (goal <= 1.05); all service %v ctld %v",
		nc, s50, pct(res["service"], 99), c50, pct(res["ctld"], 99), ratio(s50, c50), res["service"], res["ctld"])
	b.Logf("exec /bin/true round trip, n=%d each: service p50 %.1f ms p99 %.1f ms, ctld socket p50 %.1f ms p99 %.1f ms, service/ctld p50 %.3f (goal <= 1.1)",
		ne, se50, pct(res["service-exec"], 99), ce50, pct(res["ctld-exec"], 99), ratio(se50, ce50))
	b.ReportMetric(ratio(s50, c50), "create-service/ctld-p50")
	b.ReportMetric(ratio(se50, ce50), "exec-service/ctld-p50")
}

// TestServicePythonSDKOnCtld: sdk/python's test suite against the service
// over a real ctld: create, streamed run, exec with stdin, files, another
// owner's 404, kill with a verified proof (busybox, overlay); snapshot,
// fork, pause, restore and resume of a block-mode sandbox (a busybox
// template imported into ctld's block store); a persistent volume made
// in that store, mounted by a sandbox, refused delete while held, then
// deleted; bad keys and idempotent creates.
func TestServicePythonSDKOnCtld(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is needed for the Python SDK's suite: %v", err)
	}
	sdk, err := filepath.Abs("../../sdk/python")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t)
	e.useBlock()
	e.start("a")
	e.waitPrimary("a", 2*time.Minute)
	cx := ctx(t, 15*time.Minute)

	// A block-mode template of its own name (the service names a
	// template once, with its mode).
	repo := e2eRepo(t, e.stateDir)
	src := t.TempDir()
	if err := template.BuildBusybox(src, "/bin/busybox"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := template.ImportSource(cx, repo, "busyblk", template.Source{Kind: template.KindDir, Path: src}, template.ImageOptions{Size: 64 << 20}, t.TempDir()); err != nil {
		t.Fatalf("import the block template: %v", err)
	}
	s := startService(t, e, func(srv *service.Server) {
		srv.Templates = append(srv.Templates, client.Template{Name: "busyblk", Mode: "block"})
		srv.Volumes = service.BlockVolumes{Repo: repo, TmpDir: t.TempDir()}
	})
	if _, err := s.store.CreateOwner(cx, "team-b"); err != nil {
		t.Fatal(err)
	}
	other, _, err := s.store.CreateKey(cx, "team-b")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(cx, py, "-m", "unittest", "-v", "tests.test_sdk")
	cmd.Dir = sdk
	cmd.Env = append(os.Environ(), "PYTHONPATH="+sdk, "PYTHONDONTWRITEBYTECODE=1", "CTLD_SDK_URL="+s.url, "CTLD_SDK_KEY="+s.c.Key,
		"CTLD_SDK_OTHER_KEY="+other, "CTLD_SDK_TEMPLATE=busybox", "CTLD_SDK_BLOCK_TEMPLATE=busyblk")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("python3 -m unittest (%v):\n%s", time.Since(start).Round(time.Second), out)
	if err != nil {
		t.Fatalf("the Python SDK's suite failed on ctld: %v", err)
	}
	if n := strings.Count(string(out), " ... ok"); n < 4 {
		t.Fatalf("%d tests passed, want the suite's 4 at least", n)
	}
	// Nothing of the suite's is left on the node.
	l, err := e.client().List(cx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range l.Sandboxes {
		if sb.State != api.StateReleased && sb.State != api.StateFailed {
			t.Errorf("the suite left sandbox %s %s", sb.ID, sb.State)
		}
	}
}
