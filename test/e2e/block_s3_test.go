package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/blockstore/s3store/s3test"
	"github.com/ctld/ctld/internal/template"
)

// TestBlockClaimFromS3Template: with `--block-store s3://` ctld, its writer
// and `ctl-manager template import` use an S3 bucket (versitygw on
// loopback). ctld gets the credentials in its environment (the writer in
// its own, from ctld), ctl-manager from a 0600 file; a template imported
// into the bucket is claimed in block mode, the guest reads its file and
// writes and syncs, and a pause seals it as the sandbox's head in the
// bucket; a second node (own state, the same bucket and node key) resumes
// it from there with the file in place, and its release ends with a clean
// proof. A ctld with a wrong secret refuses to start, naming the cause.
func TestBlockClaimFromS3Template(t *testing.T) {
	srv := s3test.Start(t) // first: stopped after the releases
	e := newEnv(t)
	bucket := srv.NewBucket(t)
	e.useBlock("--block-store", "s3://"+bucket+"/node", "--s3-endpoint", srv.Endpoint)

	// A wrong secret: ctld exits at start with the cause.
	e.start("a", "AWS_ACCESS_KEY_ID="+srv.Access, "AWS_SECRET_ACCESS_KEY=wrong")
	badProc := e.procs["a"]
	delete(e.procs, "a")
	done := make(chan error, 1)
	go func() { done <- badProc.Wait() }()
	select {
	case err := <-done:
		if err == nil {
			t.Error("ctld with a wrong S3 secret exited 0")
		}
	case <-time.After(2 * time.Minute):
		_ = badProc.Process.Kill()
		<-done
		t.Fatal("ctld with a wrong S3 secret still runs after 2m")
	}
	if !e.logsContain("denied (bad credentials") {
		t.Error("ctld's log names no bad credentials")
	}

	e.start("a", "AWS_ACCESS_KEY_ID="+srv.Access, "AWS_SECRET_ACCESS_KEY="+srv.Secret)
	e.waitPrimary("a", 2*time.Minute)
	c := e.client()

	src := filepath.Join(t.TempDir(), "tree")
	if err := template.BuildBusybox(src, "/bin/busybox"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "motd"), []byte("from s3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	creds := filepath.Join(t.TempDir(), "s3.env")
	if err := os.WriteFile(creds, []byte("AWS_ACCESS_KEY_ID="+srv.Access+"\nAWS_SECRET_ACCESS_KEY="+srv.Secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := e.ctlManager("template", "import", "s3tpl", src, "--size", "64Mi", "--store", "s3://"+bucket+"/node", "--s3-endpoint", srv.Endpoint,
		"--s3-credentials-file", creds, "--node-key", filepath.Join(e.stateDir, "blockstore.key"), "--tmp-dir", t.TempDir())
	t.Logf("ctl-manager template import: %s", strings.TrimSpace(out))

	req := claimReq("c1", 1)
	req.RootFS = api.RootFS{Mode: api.RootFSBlock, Template: "s3tpl"}
	if _, err := c.Claim(ctx(t, 3*time.Minute), "s3", req); err != nil {
		t.Fatalf("block claim of the S3 template: %v", err)
	}
	r, err := c.Exec(ctx(t, 2*time.Minute), "s3", api.ExecRequest{Args: []string{"/bin/sh", "-c", "cat /motd && echo written > /w && sync && cat /w"}})
	if err != nil || r.ExitCode != 0 || string(r.Stdout) != "from s3\nwritten\n" {
		t.Fatalf("guest on the S3 template: %v, exit %d, %q %q", err, r.ExitCode, r.Stdout, r.Stderr)
	}
	p, err := c.Pause(ctx(t, 3*time.Minute), "s3", api.PauseRequest{OperationID: "p1", Generation: 1})
	if err != nil || !p.Proof.Clean || p.Head.Seq != 1 {
		t.Fatalf("pause: %v, head %+v, proof %+v", err, p.Head, p.Proof.Checks)
	}

	// A second node (own state dir, cgroup parent, nft table; the same
	// bucket and node key) resumes the sandbox from its head.
	e2 := newEnv(t)
	e2.useBlock("--block-store", "s3://"+bucket+"/node", "--s3-endpoint", srv.Endpoint, "--node-key", filepath.Join(e.stateDir, "blockstore.key"))
	e2.start("a", "AWS_ACCESS_KEY_ID="+srv.Access, "AWS_SECRET_ACCESS_KEY="+srv.Secret)
	e2.waitPrimary("a", 2*time.Minute)
	c2 := e2.client()
	req2 := req
	req2.OperationID, req2.Generation = "c2", 2
	res, err := c2.Claim(ctx(t, 3*time.Minute), "s3", req2)
	if err != nil {
		t.Fatalf("resume on the second node: %v", err)
	}
	if res.Sandbox.Writer == nil || res.Sandbox.Writer.Base != "sandboxes/s3@1" {
		t.Errorf("the second node's writer %+v: want base sandboxes/s3@1 (the head)", res.Sandbox.Writer)
	}
	r, err = c2.Exec(ctx(t, 2*time.Minute), "s3", api.ExecRequest{Args: []string{"/bin/sh", "-c", "cat /w /motd"}})
	if err != nil || r.ExitCode != 0 || string(r.Stdout) != "written\nfrom s3\n" {
		t.Fatalf("guest resumed on the second node: %v, exit %d, %q %q", err, r.ExitCode, r.Stdout, r.Stderr)
	}
	rel, err := c2.Release(ctx(t, 3*time.Minute), "s3", api.ReleaseRequest{OperationID: "r2", Generation: 2})
	if err != nil || !rel.Proof.Clean {
		t.Fatalf("release on the second node: %v, %+v", err, rel.Proof.Checks)
	}
}
