package service

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/client"
)

func TestAllEndpointsContract(t *testing.T) {
	exercised.Lock()
	exercised.all = true
	exercised.Unlock()
	e := newEnv(t, nil)
	ctx := context.Background()

	doc, err := e.a.OpenAPI(ctx)
	if err != nil || !bytes.Equal(doc, OpenAPI) {
		t.Fatalf("openapi.json served %d bytes, %v; want the embedded document", len(doc), err)
	}
	tpls, err := e.a.Templates(ctx)
	if err != nil || len(tpls) != 2 {
		t.Fatalf("templates = %+v, %v", tpls, err)
	}

	sb, err := e.a.Create(ctx, client.CreateRequest{
		Template: "busybox", Resources: &client.Resources{CPU: "250m", Memory: "128Mi", Disk: "1Gi", PIDs: 64},
		Network: &client.Network{Mode: "deny_all"}, Env: map[string]string{"A": "1"}, Args: []string{"sleep", "infinity"},
		Cwd: "/", User: &client.User{UID: 1000, GID: 1000}, Labels: map[string]string{"job": "ci", "run": "1"}, TimeoutSec: 600,
	}, client.IdempotencyKey("create-1"))
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != client.StateReady || sb.Resources.CPUMillis != 250 || sb.Resources.MemoryBytes != 128<<20 || sb.EndsAt == nil || sb.Generation != 1 {
		t.Fatalf("created %+v", sb)
	}
	if got, err := e.a.Get(ctx, sb.ID); err != nil || got.ID != sb.ID || got.Labels["job"] != "ci" {
		t.Fatalf("get = %+v, %v", got, err)
	}

	// exec: JSON with stdin, and as an event stream.
	res, err := e.a.Exec(ctx, sb.ID, client.ExecRequest{Args: []string{"cat"}, Stdin: []byte("hello\n")})
	if err != nil || res.ExitCode != 0 || string(res.Stdout) != "hello\n" {
		t.Fatalf("exec cat = %+v, %v", res, err)
	}
	res, err = e.a.Exec(ctx, sb.ID, client.ExecRequest{Args: []string{"fail", "3", "bad"}, TimeoutSec: 10})
	if err != nil || res.ExitCode != 3 || string(res.Stderr) != "bad\n" {
		t.Fatalf("exec fail = %+v, %v", res, err)
	}
	var out, errb bytes.Buffer
	code, err := e.a.ExecStream(ctx, sb.ID, client.ExecRequest{Args: []string{"sh", "-c", "echo out; echo err >&2"}}, &out, &errb)
	if err != nil || code != 0 || out.String() != "out\n" || errb.String() != "err\n" {
		t.Fatalf("exec stream = %d %q %q, %v", code, out.String(), errb.String(), err)
	}

	// files
	data := bytes.Repeat([]byte("0123456789"), 1000)
	if err := e.a.Mkdir(ctx, sb.ID, client.MkdirRequest{Path: "/work/sub", Parents: true}); err != nil {
		t.Fatal(err)
	}
	if err := e.a.WriteFile(ctx, sb.ID, "/work/sub/a.txt", bytes.NewReader(data), int64(len(data)), client.IdempotencyKey("put-1")); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	if n, err := e.a.ReadFile(ctx, sb.ID, "/work/sub/a.txt", &got); err != nil || n != int64(len(data)) || !bytes.Equal(got.Bytes(), data) {
		t.Fatalf("read back %d bytes, %v", n, err)
	}
	if fi, err := e.a.Stat(ctx, sb.ID, "/work/sub/a.txt"); err != nil || fi.Size != int64(len(data)) || fi.IsDir {
		t.Fatalf("stat = %+v, %v", fi, err)
	}
	if err := e.a.Move(ctx, sb.ID, client.MoveRequest{From: "/work/sub/a.txt", To: "/work/b.txt"}); err != nil {
		t.Fatal(err)
	}
	ents, err := e.a.ListFiles(ctx, sb.ID, "/work")
	if err != nil || len(ents) != 2 {
		t.Fatalf("list /work = %+v, %v", ents, err)
	}
	if err := e.a.Remove(ctx, sb.ID, client.RemoveRequest{Path: "/work", Recursive: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.a.Stat(ctx, sb.ID, "/work/b.txt"); errCode(err) != client.CodeNotFound {
		t.Fatalf("stat after remove: %v", err)
	}

	// logs: the whole, the tail, and a follow that ends when idle.
	e.node.Lock()
	e.node.GuestLog[sb.ID] = "one\ntwo\nthree\n"
	e.node.Unlock()
	var logb bytes.Buffer
	if reason, err := e.a.Logs(ctx, sb.ID, client.LogsOptions{Tail: 2}, &logb); err != nil || logb.String() != "two\nthree\n" || reason == "" {
		t.Fatalf("logs tail 2 = %q %q, %v", logb.String(), reason, err)
	}
	logb.Reset()
	go func() {
		time.Sleep(200 * time.Millisecond)
		e.node.Lock()
		e.node.GuestLog[sb.ID] += "four\n"
		e.node.Unlock()
	}()
	reason, err := e.a.Logs(ctx, sb.ID, client.LogsOptions{Follow: true, IdleSec: 1}, &logb)
	if err != nil || logb.String() != "one\ntwo\nthree\nfour\n" || !strings.Contains(reason, "no output") {
		t.Fatalf("logs follow = %q %q, %v", logb.String(), reason, err)
	}

	// network: a live update answers the policy in force.
	pol := client.Network{Mode: "restricted", Rules: []client.NetworkRule{{CIDR: "203.0.113.0/24", Protocol: "tcp", Ports: []string{"443"}}}}
	if got, err := e.a.UpdateNetwork(ctx, sb.ID, pol); err != nil || got.Mode != "restricted" || len(got.Rules) != 1 {
		t.Fatalf("network update = %+v, %v", got, err)
	}
	if p, ok := e.node.Policy(sb.ID); !ok || p.Mode != "restricted" {
		t.Fatalf("node policy = %+v", p)
	}
	if _, err := e.a.UpdateNetwork(invalid(ctx), sb.ID, client.Network{Mode: "restricted", Rules: []client.NetworkRule{{CIDR: "not-a-cidr"}}}); errCode(err) != client.CodeInvalidArgument {
		t.Fatalf("bad rule: %v", err)
	}

	// timeout: extend moves the deadline.
	ext, err := e.a.SetTimeout(ctx, sb.ID, 3600)
	if err != nil || ext.EndsAt == nil || !ext.EndsAt.After(*sb.EndsAt) {
		t.Fatalf("extend = %+v, %v", ext, err)
	}

	// list: label filter and paging.
	for i := range 3 {
		if _, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox", Labels: map[string]string{"job": "batch", "i": fmt.Sprint(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	page, err := e.a.List(ctx, client.ListOptions{Labels: map[string]string{"job": "batch"}, Limit: 2})
	if err != nil || len(page.Sandboxes) != 2 || page.NextCursor == "" {
		t.Fatalf("page 1 = %+v, %v", page, err)
	}
	page2, err := e.a.List(ctx, client.ListOptions{Labels: map[string]string{"job": "batch"}, Limit: 2, Cursor: page.NextCursor})
	if err != nil || len(page2.Sandboxes) != 1 || page2.NextCursor != "" {
		t.Fatalf("page 2 = %+v, %v", page2, err)
	}
	if l, err := e.a.List(ctx, client.ListOptions{State: client.StateReady}); err != nil || len(l.Sandboxes) != 4 {
		t.Fatalf("ready = %d, %v", len(l.Sandboxes), err)
	}

	// wait=false answers at once; GET shows it becoming ready.
	nw, err := e.a.CreateNoWait(ctx, client.CreateRequest{Template: "busybox"})
	if err != nil || (nw.State != client.StateCreating && nw.State != client.StateReady) {
		t.Fatalf("create wait=false = %+v, %v", nw, err)
	}
	waitState(t, e.a, nw.ID, client.StateReady)

	// pause and resume (block mode only).
	if _, err := e.a.Pause(ctx, sb.ID); errCode(err) != client.CodeInvalidArgument {
		t.Fatalf("pause of an overlay sandbox: %v", err)
	}
	blk, err := e.a.Create(ctx, client.CreateRequest{Template: "debian"})
	if err != nil {
		t.Fatal(err)
	}
	if p, err := e.a.Pause(ctx, blk.ID); err != nil || p.State != client.StatePaused {
		t.Fatalf("pause = %+v, %v", p, err)
	}
	if r, err := e.a.Resume(ctx, blk.ID); err != nil || r.State != client.StateReady || r.Generation != 2 {
		t.Fatalf("resume = %+v, %v", r, err)
	}
	if _, err := e.a.Resume(ctx, blk.ID); errCode(err) != client.CodeConflict {
		t.Fatalf("resume of a running sandbox: %v", err)
	}

	// destroy answers the verified proof; a second destroy answers it again.
	d, err := e.a.Destroy(ctx, sb.ID)
	if err != nil || !d.Proof.Verified || !d.Proof.Clean || d.Sandbox.State != client.StateDestroyed || len(d.Proof.Checks) == 0 {
		t.Fatalf("destroy = %+v, %v", d, err)
	}
	d2, err := e.a.Destroy(ctx, sb.ID)
	if err != nil || d2.Proof.OperationID != d.Proof.OperationID {
		t.Fatalf("second destroy = %+v, %v", d2, err)
	}
	if _, err := e.a.Exec(ctx, sb.ID, client.ExecRequest{Args: []string{"true"}}); errCode(err) != client.CodeConflict {
		t.Fatalf("exec in a destroyed sandbox: %v", err)
	}
}

// waitState waits until the sandbox is in state; an ended one (destroyed,
// failed) also until its reason is recorded (the manager's record of the
// release or failure comes a moment before the service's).
func waitState(t *testing.T, c *client.Client, id, state string) client.Sandbox {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	ended := state == client.StateDestroyed || state == client.StateFailed
	for {
		sb, err := c.Get(context.Background(), id)
		if err == nil && sb.State == state && (!ended || sb.Reason != "") {
			return sb
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s: %+v, %v; want state %s", id, sb, err, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestOtherOwnerSeesNothing: for every endpoint on a sandbox, team-b's
// key gets not_found for team-a's sandbox and changes nothing; a missing
// or wrong key gets unauthenticated on every endpoint.
func TestOtherOwnerSeesNothing(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	sb, err := e.a.Create(ctx, client.CreateRequest{Template: "debian", Labels: map[string]string{"secret": "yes"}, TimeoutSec: 600})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.a.WriteFile(ctx, sb.ID, "/f", strings.NewReader("x"), 1); err != nil {
		t.Fatal(err)
	}
	vol, err := e.a.CreateVolume(ctx, client.VolumeCreateRequest{Size: "1Mi"})
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]func(c *client.Client) error{
		"get volume":    func(c *client.Client) error { _, err := c.Volume(ctx, vol.ID); return err },
		"delete volume": func(c *client.Client) error { _, err := c.DeleteVolume(ctx, vol.ID); return err },
		"mount volume": func(c *client.Client) error {
			_, err := c.Create(ctx, client.CreateRequest{Template: "busybox", Volumes: []client.VolumeMount{{ID: vol.ID, Path: "/data"}}})
			return err
		},
		"get":     func(c *client.Client) error { _, err := c.Get(ctx, sb.ID); return err },
		"destroy": func(c *client.Client) error { _, err := c.Destroy(ctx, sb.ID); return err },
		"exec": func(c *client.Client) error {
			_, err := c.Exec(ctx, sb.ID, client.ExecRequest{Args: []string{"true"}})
			return err
		},
		"exec stream": func(c *client.Client) error {
			_, err := c.ExecStream(ctx, sb.ID, client.ExecRequest{Args: []string{"true"}}, nil, nil)
			return err
		},
		"read":      func(c *client.Client) error { _, err := c.ReadFile(ctx, sb.ID, "/f", &bytes.Buffer{}); return err },
		"write":     func(c *client.Client) error { return c.WriteFile(ctx, sb.ID, "/f", strings.NewReader("y"), 1) },
		"list":      func(c *client.Client) error { _, err := c.ListFiles(ctx, sb.ID, "/"); return err },
		"stat":      func(c *client.Client) error { _, err := c.Stat(ctx, sb.ID, "/f"); return err },
		"mkdir":     func(c *client.Client) error { return c.Mkdir(ctx, sb.ID, client.MkdirRequest{Path: "/d"}) },
		"remove":    func(c *client.Client) error { return c.Remove(ctx, sb.ID, client.RemoveRequest{Path: "/f"}) },
		"move":      func(c *client.Client) error { return c.Move(ctx, sb.ID, client.MoveRequest{From: "/f", To: "/g"}) },
		"timeout":   func(c *client.Client) error { _, err := c.SetTimeout(ctx, sb.ID, 5); return err },
		"pause":     func(c *client.Client) error { _, err := c.Pause(ctx, sb.ID); return err },
		"resume":    func(c *client.Client) error { _, err := c.Resume(ctx, sb.ID); return err },
		"snapshot":  func(c *client.Client) error { _, err := c.Snapshot(ctx, sb.ID, "s1"); return err },
		"snapshots": func(c *client.Client) error { _, err := c.Snapshots(ctx, sb.ID); return err },
		"restore":   func(c *client.Client) error { _, err := c.Restore(ctx, sb.ID, "s1"); return err },
		"fork":      func(c *client.Client) error { _, err := c.Fork(ctx, sb.ID, client.ForkRequest{}); return err },
		"logs": func(c *client.Client) error {
			_, err := c.Logs(ctx, sb.ID, client.LogsOptions{}, &bytes.Buffer{})
			return err
		},
		"logs follow": func(c *client.Client) error {
			_, err := c.Logs(ctx, sb.ID, client.LogsOptions{Follow: true, IdleSec: 1}, &bytes.Buffer{})
			return err
		},
		"events": func(c *client.Client) error {
			return c.Events(ctx, sb.ID, func(client.Event) error { return nil })
		},
		"network": func(c *client.Client) error {
			_, err := c.UpdateNetwork(ctx, sb.ID, client.Network{Mode: "open"})
			return err
		},
	}
	for name, call := range calls {
		if err := call(e.b); errCode(err) != client.CodeNotFound {
			t.Errorf("%s by another owner: %v, want not_found", name, err)
		}
	}
	if l, err := e.b.List(ctx, client.ListOptions{}); err != nil || len(l.Sandboxes) != 0 {
		t.Errorf("another owner's list = %+v, %v; want empty", l, err)
	}
	if l, err := e.b.List(ctx, client.ListOptions{Labels: map[string]string{"secret": "yes"}}); err != nil || len(l.Sandboxes) != 0 {
		t.Errorf("another owner's label filter = %+v, %v; want empty", l, err)
	}
	// Nothing changed: still ready, the file unchanged, the deadline as set.
	got, err := e.a.Get(ctx, sb.ID)
	if err != nil || got.State != client.StateReady || got.EndsAt == nil || !got.EndsAt.Equal(*sbEnds(t, e, sb.ID)) {
		t.Fatalf("after the other owner's calls: %+v, %v", got, err)
	}
	var f bytes.Buffer
	if _, err := e.a.ReadFile(ctx, sb.ID, "/f", &f); err != nil || f.String() != "x" {
		t.Fatalf("file after the other owner's calls: %q, %v", f.String(), err)
	}
	if len(e.node.ReleaseOps) != 0 {
		t.Fatalf("the node saw releases: %v", e.node.ReleaseOps)
	}
	if v, err := e.node.Volume(ctx, sb.ID); err == nil {
		t.Fatalf("the other owner's calls published a head or snapshot: %+v", v)
	}
	if l, _ := e.node.List(ctx); len(l.Sandboxes) != 1 {
		t.Fatalf("the other owner's calls made sandboxes: %+v", l.Sandboxes)
	}
	if v, err := e.a.Volume(ctx, vol.ID); err != nil || v.State != client.VolumeReady || v.HeldBy != "" {
		t.Fatalf("the volume after the other owner's calls: %+v, %v", v, err)
	}
	if l, err := e.b.Volumes(ctx, 0, ""); err != nil || len(l.Volumes) != 0 {
		t.Fatalf("another owner's volume list = %+v, %v; want empty", l, err)
	}

	// Missing, malformed, unknown and revoked keys: 401 on every endpoint.
	revoked, rec, err := e.store.CreateKey(ctx, "team-a")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.store.RevokeKey(ctx, rec.KeyID); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"", "nope", e.keyA[:len(e.keyA)-1] + "A", revoked} {
		c := &client.Client{BaseURL: e.url, Key: key, HTTP: e.a.HTTP}
		calls["templates"] = func(c *client.Client) error { _, err := c.Templates(ctx); return err }
		calls["list sandboxes"] = func(c *client.Client) error { _, err := c.List(ctx, client.ListOptions{}); return err }
		calls["create"] = func(c *client.Client) error {
			_, err := c.Create(ctx, client.CreateRequest{Template: "busybox"})
			return err
		}
		for name, call := range calls {
			if key == e.keyA[:len(e.keyA)-1]+"A" && e.keyA[len(e.keyA)-1] == 'A' {
				continue // the "wrong" key would be the right one
			}
			err := call(c)
			var ce *client.Error
			if ok := asClientErr(err, &ce); !ok || ce.Code != client.CodeUnauthenticated || ce.Status != http.StatusUnauthorized {
				t.Errorf("%s with key %.8q: %v, want 401 unauthenticated", name, key, err)
			}
		}
	}
}

func sbEnds(t *testing.T, e *env, id string) *time.Time {
	o, err := e.store.OwnedSandbox(context.Background(), "team-a", id)
	if err != nil {
		t.Fatal(err)
	}
	return o.Deadline
}

func asClientErr(err error, out **client.Error) bool {
	ce, ok := err.(*client.Error)
	*out = ce
	return ok
}

func TestIdempotencyKey(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	req := client.CreateRequest{Template: "busybox", Labels: map[string]string{"try": "1"}}
	first, err := e.a.Create(ctx, req, client.IdempotencyKey("k-1"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := e.a.Create(ctx, req, client.IdempotencyKey("k-1"))
	if err != nil || again.ID != first.ID {
		t.Fatalf("retry = %+v, %v; want the first answer (%s)", again, err, first.ID)
	}
	if n := len(e.node.ClaimOps); n != 1 {
		t.Fatalf("node saw %d claims, want 1", n)
	}
	req.Labels["try"] = "2"
	if _, err := e.a.Create(ctx, req, client.IdempotencyKey("k-1")); errCode(err) != client.CodeIdempotencyMismatch {
		t.Fatalf("same key, other body: %v, want idempotency_mismatch", err)
	}
	// Keys are per owner: team-b's k-1 is its own.
	if sb, err := e.b.Create(ctx, req, client.IdempotencyKey("k-1")); err != nil || sb.ID == first.ID {
		t.Fatalf("other owner's k-1 = %+v, %v", sb, err)
	}
	// Destroy replays its proof; exec replays its output without running again.
	d1, err := e.a.Destroy(ctx, first.ID, client.IdempotencyKey("d-1"))
	if err != nil {
		t.Fatal(err)
	}
	d2, err := e.a.Destroy(ctx, first.ID, client.IdempotencyKey("d-1"))
	if err != nil || d2.Proof.OperationID != d1.Proof.OperationID || string(d2.Proof.Signature) != string(d1.Proof.Signature) {
		t.Fatalf("destroy replay = %+v, %v", d2, err)
	}
	// A file upload's key covers its bytes.
	sb, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.a.WriteFile(ctx, sb.ID, "/f", strings.NewReader("one"), 3, client.IdempotencyKey("w-1")); err != nil {
		t.Fatal(err)
	}
	if err := e.a.WriteFile(ctx, sb.ID, "/f", strings.NewReader("one"), 3, client.IdempotencyKey("w-1")); err != nil {
		t.Fatalf("upload replay: %v", err)
	}
	if err := e.a.WriteFile(ctx, sb.ID, "/f", strings.NewReader("two"), 3, client.IdempotencyKey("w-1")); errCode(err) != client.CodeIdempotencyMismatch {
		t.Fatalf("upload with other bytes, same key: %v", err)
	}
	var got bytes.Buffer
	if _, err := e.a.ReadFile(ctx, sb.ID, "/f", &got); err != nil || got.String() != "one" {
		t.Fatalf("file = %q, %v", got.String(), err)
	}
	// An answer that is not kept (a quota refusal) frees the key.
	if _, err := e.store.SetQuota(ctx, "team-a", quotaOf(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox"}, client.IdempotencyKey("q-1")); errCode(err) != client.CodeQuotaExceeded {
		t.Fatalf("over quota: %v", err)
	}
	if _, err := e.a.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.a.Create(ctx, client.CreateRequest{Template: "busybox"}, client.IdempotencyKey("q-1")); err != nil {
		t.Fatalf("retry after the quota freed up: %v", err)
	}
	// Answers are kept for IdempotencyTTL (24 h): after it, the key is new.
	e.clock.advance(25 * time.Hour)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, created, _ := e.store.BeginIdempotent(ctx, "team-a", "k-1"); created {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("k-1 still kept after 25 h")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPythonSDK runs sdk/python's suite against this server.
func TestPythonSDK(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is needed for the Python SDK's tests: %v", err)
	}
	e := newEnv(t, func(s *Server) {
		s.Templates = []client.Template{{Name: "busybox", Mode: "overlay", Languages: []string{"sh"}}, {Name: "debian", Mode: "block"}}
	})
	sdk, err := filepath.Abs("../../sdk/python")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, "-m", "unittest", "-v", "tests.test_sdk")
	cmd.Dir = sdk
	cmd.Env = append(os.Environ(), "PYTHONPATH="+sdk, "PYTHONDONTWRITEBYTECODE=1", "CTLD_SDK_URL="+e.url, "CTLD_SDK_KEY="+e.keyA,
		"CTLD_SDK_OTHER_KEY="+e.keyB, "CTLD_SDK_TEMPLATE=busybox", "CTLD_SDK_BLOCK_TEMPLATE=debian")
	out, err := cmd.CombinedOutput()
	t.Logf("python3 -m unittest:\n%s", out)
	if err != nil {
		t.Fatalf("the Python SDK's suite failed: %v", err)
	}
}
