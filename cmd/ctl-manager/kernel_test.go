package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/ha"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/manager"
)

// startCtld runs the real `ctld run --slot a` built by the VM harness and
// waits until it serves the API as primary.
func startCtld(t *testing.T) (socket string) {
	t.Helper()
	socket, _ = startCtldState(t)
	return socket
}

// startCtldState is startCtld that also returns ctld's state dir (its
// block store is blockstore/ there, its node key blockstore.key).
func startCtldState(t *testing.T) (socket, stateDir string) {
	t.Helper()
	bin := ktest.RequireBuilt(t, "ctld")
	root := t.TempDir()
	// The state dir is on the VM's state disk (XFS, prjquota): disk leases
	// are refused where they cannot be enforced.
	stateDir, runDir := filepath.Join(ktest.QuotaDir(t), "state"), filepath.Join(root, "run")
	parent := "ctlm-kt-" + strings.ReplaceAll(t.Name(), "/", "-") + ".slice"
	ktest.CheckLeaks(t, ktest.SnapshotOptions{RunscRoots: []string{filepath.Join(runDir, "runsc")}, RunDir: runDir, StateDir: stateDir})
	// ctld's nft table is its own: ctld never deletes it (a new primary
	// must find it), so the test names one and deletes it once ctld stopped;
	// the default table left behind would drop later tests' ctl-* links.
	table := "ctlm-kt-" + strings.ReplaceAll(t.Name(), "/", "-")
	t.Cleanup(func() {
		// The parent is ctld's to create and the operator's to remove.
		if err := os.Remove(filepath.Join(ktest.CgroupRoot, parent)); err != nil && !os.IsNotExist(err) {
			t.Errorf("remove cgroup parent: %v", err)
		}
		if err := ktest.DeleteNftTable(table); err != nil {
			t.Errorf("delete nft table %s: %v", table, err)
		}
	})
	logPath := filepath.Join(root, "ctld-a.log")
	lf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	cmd := exec.Command(bin, "run", "--slot", "a", "--state-dir", stateDir, "--run-dir", runDir, "--cgroup-parent", parent, "--group", "", "--nft-table", table)
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start ctld: %v", err)
	}
	t.Cleanup(func() {
		ktest.StopProcess(t, cmd, "ctld", 30*time.Second)
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("ctld log:\n%s", b)
		}
	})
	socket = filepath.Join(runDir, "ctld.sock")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		st, perr := ha.Probe(ctx, filepath.Join(runDir, "ctld-a.sock"))
		if perr == nil && st.Role == ha.RolePrimary && st.Health == "ok" {
			if _, err := (&api.Client{SocketPath: socket}).Node(ctx); err == nil {
				return socket, stateDir
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("ctld not serving as primary within 60s (last probe: %+v, %v)", st, perr)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TestKernelCLIAgainstRealCtld drives the whole CLI against a real ctld
// with a real gVisor guest: create, exec, files, ls, destroy with a
// verified cleanup proof, and the next generation of the same identity.
func TestKernelCLIAgainstRealCtld(t *testing.T) {
	ktest.RequireCgroup2(t, "cpu", "memory", "pids")
	ktest.RequireBinary(t, "runsc")
	socket := startCtld(t)
	e := &env{t: t, socket: socket, db: filepath.Join(t.TempDir(), "manager.db")}
	released := false
	t.Cleanup(func() {
		if !released {
			e.run("", "sandbox", "destroy", "kt1")
		}
	})

	var st manager.NodeStatus
	if err := json.Unmarshal([]byte(e.ok("--json", "node", "status")), &st); err != nil || st.Node.Role != "primary" {
		t.Fatalf("node status = %+v, %v", st, err)
	}

	out := e.ok("sandbox", "create", "kt1", "--cpu", "0.5", "--memory", "256Mi", "--pids", "128")
	if !strings.Contains(out, "sandbox kt1 ready: generation 1") {
		t.Fatalf("create:\n%s", out)
	}
	t.Logf("create:\n%s", out)

	r := e.run("", "sandbox", "exec", "kt1", "--", "/bin/sh", "-c", "echo hello from $(hostname); echo oops >&2; exit 3")
	if r.code != 3 || r.stdout != "hello from kt1\n" || r.stderr != "oops\n" {
		t.Fatalf("exec = %+v, want exit 3 with the guest's output", r)
	}
	if r := e.run("file body", "sandbox", "file", "put", "kt1", "/note"); r.code != 0 {
		t.Fatalf("file put = %+v", r)
	}
	if out := e.ok("sandbox", "exec", "kt1", "--", "/bin/cat", "/note"); out != "file body" {
		t.Fatalf("guest sees %q", out)
	}
	if out := e.ok("sandbox", "file", "get", "kt1", "/note"); out != "file body" {
		t.Fatalf("file get = %q", out)
	}
	if out := e.ok("sandbox", "ls"); !regexp.MustCompile(`(?m)^kt1\s+1\s+ready\s+ready\s+500m\s+256Mi\s+in_sync$`).MatchString(out) {
		t.Fatalf("ls:\n%s", out)
	}

	out = e.ok("sandbox", "destroy", "kt1")
	released = true
	m := regexp.MustCompile(`proof (\S+) verified: kt1 generation 1 is gone`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("destroy:\n%s", out)
	}
	t.Logf("destroy:\n%s", out)
	var v manager.Verdict
	if err := json.Unmarshal([]byte(e.ok("--json", "proof", "verify", m[1])), &v); err != nil || !v.OK() || len(v.Proof.Checks) == 0 {
		t.Fatalf("proof verify = %+v, %v", v, err)
	}
	if err := json.Unmarshal([]byte(e.ok("--json", "node", "status")), &st); err != nil || len(st.Record.PublicKey) == 0 {
		t.Fatalf("node key not pinned after the first proof: %+v, %v", st.Record, err)
	}
	if st.Node.Capacity.Leased.CPUMillis != 0 {
		t.Fatalf("capacity still leased after a proven release: %+v", st.Node.Capacity.Leased)
	}

	// The identity outlives its generation.
	released = false
	if out := e.ok("sandbox", "create", "kt1", "--", "/bin/sh", "-c", "echo main says hi; echo to stderr >&2; exec sleep 1000000"); !strings.Contains(out, "generation 2") {
		t.Fatalf("recreate:\n%s", out)
	}
	// The main process's output, as the node keeps it.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if out := e.ok("sandbox", "logs", "kt1"); out == "main says hi\nto stderr\n" {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("sandbox logs = %q", out)
		}
	}
	if r := e.run("", "sandbox", "logs", "kt1", "--follow", "--tail", "1", "--idle", "1s"); r.code != 0 || r.stdout != "to stderr\n" ||
		!strings.Contains(r.stderr, "follow of sandbox kt1 generation 2 ended: no output for 1s") {
		t.Fatalf("sandbox logs --follow = %+v", r)
	}
	if out := e.ok("sandbox", "destroy", "kt1"); !strings.Contains(out, "verified: kt1 generation 2 is gone") {
		t.Fatalf("second destroy:\n%s", out)
	}
	released = true
}
