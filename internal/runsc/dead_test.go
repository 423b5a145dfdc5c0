package runsc

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// deadState is runsc's state for a root container as runsc 20221219 writes
// it for ctld (pre-created lease: cgroup v2 with no "own" directories), cut
// to the fields that matter, with the sandbox and gofer pids given.
func deadState(id string, sandboxPid, goferPid int) map[string]any {
	return map[string]any{
		"id": id, "status": "running", "goferPid": goferPid,
		"spec": map[string]any{"ociVersion": "1.0.2-dev", "process": map[string]any{"args": []string{"sleep", "1"}}},
		"sandbox": map[string]any{
			"id": id, "pid": sandboxPid,
			"cgroup": map[string]any{"cgroupv2": map[string]any{"mountpoint": "/sys/fs/cgroup", "path": "/ctld.slice/" + id, "own": nil}},
		},
		"compatCgroup": map[string]any{"cgroupunknown": nil},
	}
}

func writeState(t *testing.T, r *Runtime, id string, st map[string]any) {
	t.Helper()
	if err := os.MkdirAll(r.Root, 0o711); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.Root, stateName(id, "state")), b, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.Root, stateName(id, "lock")), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	writeVersion(t, r, id, StateFormats[0])
}

// writeVersion records build as the runsc that made container id, as
// Create does.
func writeVersion(t *testing.T, r *Runtime, id, build string) {
	t.Helper()
	if err := os.MkdirAll(r.ContainerLogDir(id), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.ContainerLogDir(id), versionFile), []byte(build+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// startProc runs the test binary as a sleeping helper with argv as its
// command line, and kills and reaps it when the test ends.
func startProc(t *testing.T, argv ...string) int {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Args = argv
	cmd.Env = append(os.Environ(), helperEnv+"=sleep")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	// The command line is the child's once it exec'd.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if st, err := readProc(cmd.Process.Pid); err == nil && slices.Equal(st.argv, argv) {
			return cmd.Process.Pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("helper %v never showed its command line", argv)
		}
	}
}

// zombie returns the pid of an exited child that is not reaped until the
// test ends.
func zombie(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("/bin/true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Wait() })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if st, err := readProc(cmd.Process.Pid); err == nil && st.zombie {
			return cmd.Process.Pid
		}
		if time.Now().After(deadline) {
			t.Fatal("child never became a zombie")
		}
	}
}

// reapedPid returns the pid of a child that has exited and been reaped.
func reapedPid(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("/bin/true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

// TestDeleteDeadWithoutRunsc: a container whose sandbox and gofer are dead
// (reaped, a zombie, or a pid now held by another program) is deleted by
// removing runsc's two files; runsc is not started.
func TestDeleteDeadWithoutRunsc(t *testing.T) {
	for name, pids := range map[string]func(t *testing.T) (int, int){
		"reaped":      func(t *testing.T) (int, int) { return reapedPid(t), reapedPid(t) },
		"zombie":      func(t *testing.T) (int, int) { return zombie(t), 0 },
		"pid reused":  func(t *testing.T) (int, int) { return os.Getpid(), startProc(t, "sleep", "--root=/elsewhere") },
		"kernel pid2": func(t *testing.T) (int, int) { return 2, reapedPid(t) },
	} {
		t.Run(name, func(t *testing.T) {
			r, dir := newFake(t)
			sandbox, gofer := pids(t)
			writeState(t, r, "c1", deadState("c1", sandbox, gofer))
			if err := r.Delete(context.Background(), "c1"); err != nil {
				t.Fatal(err)
			}
			if files, err := stateFiles(r.Root, "c1"); err != nil || len(files) != 0 {
				t.Fatalf("state files after Delete: %q, %v", files, err)
			}
			if b, err := os.ReadFile(filepath.Join(dir, "calls")); err == nil {
				t.Fatalf("Delete of a dead container ran runsc: %s", b)
			}
			if ok, detail := r.CheckGone(context.Background(), "c1"); !ok {
				t.Fatalf("CheckGone: %s", detail)
			}
		})
	}
}

// TestDeleteLeavesLiveOrUnusualToRunsc: whenever a process of the container
// may live, or deleting it needs more than its files (a held lock, hooks,
// a cgroup runsc made, a sub-container, a state it cannot read), Delete
// removes nothing itself and runs `runsc delete --force`.
func TestDeleteLeavesLiveOrUnusualToRunsc(t *testing.T) {
	cases := map[string]struct {
		why   string // what removeDead says keeps it from removing
		state func(t *testing.T, r *Runtime) map[string]any
	}{
		"sandbox runs": {"runsc-sandbox) runs", func(t *testing.T, r *Runtime) map[string]any {
			return deadState("c1", startProc(t, "runsc-sandbox", "--root="+r.Root, "boot", "c1"), 0)
		}},
		"gofer runs": {"runsc-gofer) runs", func(t *testing.T, r *Runtime) map[string]any {
			return deadState("c1", reapedPid(t), startProc(t, "runsc-gofer", "--root="+r.Root, "gofer", "--bundle", "/b"))
		}},
		"exec runs": {"processes left", func(t *testing.T, r *Runtime) map[string]any {
			startProc(t, "runsc", "--root="+r.Root, "--log="+r.logFile("c1"), "exec", "--process", "/p", "c1")
			return deadState("c1", reapedPid(t), 0)
		}},
		"lock held": {"lock held", func(t *testing.T, r *Runtime) map[string]any {
			st := deadState("c1", reapedPid(t), 0)
			writeState(t, r, "c1", st)
			f, err := os.Open(filepath.Join(r.Root, stateName("c1", "lock")))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
				t.Fatal(err)
			}
			return st
		}},
		"poststop hook": {"poststop", func(t *testing.T, r *Runtime) map[string]any {
			st := deadState("c1", reapedPid(t), 0)
			st["spec"].(map[string]any)["hooks"] = map[string]any{"poststop": []any{map[string]any{"path": "/bin/true"}}}
			return st
		}},
		"cgroup made by runsc": {"own a cgroup", func(t *testing.T, r *Runtime) map[string]any {
			st := deadState("c1", reapedPid(t), 0)
			st["sandbox"].(map[string]any)["cgroup"] = map[string]any{"cgroupv2": map[string]any{"own": []string{"/sys/fs/cgroup/x"}}}
			return st
		}},
		"cgroup v1 made by runsc": {"own a cgroup", func(t *testing.T, r *Runtime) map[string]any {
			st := deadState("c1", reapedPid(t), 0)
			st["compatCgroup"] = map[string]any{"cgroupv1": map[string]any{"own": map[string]bool{"cpu": true}}}
			return st
		}},
		"sub-container": {"not the root container", func(t *testing.T, r *Runtime) map[string]any {
			st := deadState("c1", reapedPid(t), 0)
			st["sandbox"].(map[string]any)["id"] = "other"
			return st
		}},
		"creating": {"status", func(t *testing.T, r *Runtime) map[string]any {
			st := deadState("c1", reapedPid(t), 0)
			st["status"] = "creating"
			return st
		}},
		"other container's state": {"names container", func(t *testing.T, r *Runtime) map[string]any {
			st := deadState("c1", reapedPid(t), 0)
			st["id"] = "c2"
			return st
		}},
		"no sandbox": {"not the root container", func(t *testing.T, r *Runtime) map[string]any {
			st := deadState("c1", reapedPid(t), 0)
			delete(st, "sandbox")
			return st
		}},
		"no build recorded": {"no record of the runsc build", func(t *testing.T, r *Runtime) map[string]any {
			return deadState("c1", reapedPid(t), 0)
		}},
		"unknown build": {"not known", func(t *testing.T, r *Runtime) map[string]any {
			return deadState("c1", reapedPid(t), 0)
		}},
		"control socket elsewhere": {"control socket", func(t *testing.T, r *Runtime) map[string]any {
			st := deadState("c1", reapedPid(t), 0)
			st["sandbox"].(map[string]any)["controlSocketPath"] = "/tmp/runsc-c1.sock"
			return st
		}},
		"gofer overlay": {"overlay", func(t *testing.T, r *Runtime) map[string]any {
			st := deadState("c1", reapedPid(t), 0)
			st["goferMountConfs"] = []any{map[string]any{"lower": 1, "upper": 2}}
			return st
		}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			r, dir := newFake(t)
			writeState(t, r, "c1", c.state(t, r))
			switch name {
			case "no build recorded":
				if err := os.Remove(filepath.Join(r.ContainerLogDir("c1"), versionFile)); err != nil {
					t.Fatal(err)
				}
			case "unknown build":
				writeVersion(t, r, "c1", "release-20990101.0")
			}
			if removed, why, err := r.removeDead("c1"); removed || err != nil || !strings.Contains(why, c.why) {
				t.Fatalf("removeDead = %v, %q, %v; want not removed because %q", removed, why, err, c.why)
			}
			if err := r.Delete(context.Background(), "c1"); err != nil {
				t.Fatal(err)
			}
			if files, _ := stateFiles(r.Root, "c1"); len(files) != 2 {
				t.Fatalf("Delete removed runsc's files itself: left %q", files)
			}
			b, _ := os.ReadFile(filepath.Join(dir, "calls"))
			if !strings.Contains(string(b), "delete --force c1") {
				t.Fatalf("Delete did not ask runsc: calls %q", b)
			}
		})
	}
	t.Run("unreadable state", func(t *testing.T) {
		r, dir := newFake(t)
		writeState(t, r, "c1", deadState("c1", reapedPid(t), 0))
		if err := os.WriteFile(filepath.Join(r.Root, stateName("c1", "state")), []byte("{not json"), 0o640); err != nil {
			t.Fatal(err)
		}
		if _, why, _ := r.removeDead("c1"); !strings.Contains(why, "decode state") {
			t.Fatalf("removeDead says %q, want decode state", why)
		}
		if err := r.Delete(context.Background(), "c1"); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(filepath.Join(dir, "calls")); !strings.Contains(string(b), "delete --force c1") {
			t.Fatalf("Delete did not ask runsc: calls %q", b)
		}
	})
	t.Run("unknown file", func(t *testing.T) {
		r, dir := newFake(t)
		writeState(t, r, "c1", deadState("c1", reapedPid(t), 0))
		if err := os.WriteFile(filepath.Join(r.Root, "c1_sandbox:c1.other"), nil, 0o640); err != nil {
			t.Fatal(err)
		}
		if _, why, _ := r.removeDead("c1"); !strings.Contains(why, "unknown state file") {
			t.Fatalf("removeDead says %q, want unknown state file", why)
		}
		if err := r.Delete(context.Background(), "c1"); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(filepath.Join(dir, "calls")); !strings.Contains(string(b), "delete --force c1") {
			t.Fatalf("Delete did not ask runsc: calls %q", b)
		}
	})
}

// TestDeleteCurrentBuildRemovesControlSocket: a dead container of the
// current build also leaves its control socket file in the root, which
// Delete removes with the state, without runsc.
func TestDeleteCurrentBuildRemovesControlSocket(t *testing.T) {
	r, dir := newFake(t)
	st := deadState("c1", reapedPid(t), reapedPid(t))
	sock := filepath.Join(r.Root, controlSocketName("c1"))
	st["sandbox"].(map[string]any)["controlSocketPath"] = sock
	st["goferMountConfs"] = []any{map[string]any{"lower": 1, "upper": 0}}
	writeState(t, r, "c1", st)
	writeVersion(t, r, "c1", CurrentVersion)
	if err := os.WriteFile(sock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.Delete(context.Background(), "c1"); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "calls")); err == nil {
		t.Fatalf("Delete of a dead container ran runsc: %s", b)
	}
	ents, err := os.ReadDir(r.Root)
	if err != nil || len(ents) != 0 {
		t.Fatalf("runsc root after Delete: %v, %v", ents, err)
	}
}

// TestCreateRecordsVersion: Create notes the build that makes the state,
// and only when it knows it.
func TestCreateRecordsVersion(t *testing.T) {
	r, _ := newFake(t)
	r.Version = CurrentVersion
	if err := r.Create(context.Background(), "c1", "/bundles/c1"); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(r.ContainerLogDir("c1"), versionFile)); err != nil || string(b) != CurrentVersion+"\n" {
		t.Fatalf("version record %q, %v", b, err)
	}
	r.Version = ""
	if err := r.Create(context.Background(), "c2", "/bundles/c2"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(r.ContainerLogDir("c2"), versionFile)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("version recorded without a known version: %v", err)
	}
}

// TestDeleteRefusesBadID: an id that is no valid container id never
// becomes a path of ours.
func TestDeleteRefusesBadID(t *testing.T) {
	r, _ := newFake(t)
	if removed, why, err := r.removeDead("../c1"); removed || err != nil || why == "" {
		t.Fatalf("removeDead(../c1) = %v, %q, %v; want refused", removed, why, err)
	}
}

// TestDeleteStatelessLeftovers: a runsc create killed half way leaves its
// .lock (and a current build's control socket) but no state file: runsc
// calls the container absent and leaves them, so Delete removes them
// itself when no process of it runs and the lock is free, and CheckGone
// then passes. A held lock or a live process keeps them (runsc's turn).
func TestDeleteStatelessLeftovers(t *testing.T) {
	leave := func(t *testing.T, r *Runtime) (lock string) {
		t.Helper()
		if err := os.MkdirAll(r.Root, 0o700); err != nil {
			t.Fatal(err)
		}
		lock = filepath.Join(r.Root, stateName("c1", "lock"))
		for _, f := range []string{lock, filepath.Join(r.Root, controlSocketName("c1"))} {
			if err := os.WriteFile(f, nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if ok, _ := r.CheckGone(context.Background(), "c1"); ok {
			t.Fatal("CheckGone passes with the leftovers: the test shows nothing")
		}
		return lock
	}
	t.Run("removed", func(t *testing.T) {
		r, dir := newFake(t)
		leave(t, r)
		if err := r.Delete(context.Background(), "c1"); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(filepath.Join(dir, "calls")); err == nil {
			t.Fatalf("Delete of leftovers ran runsc: %s", b)
		}
		if ok, detail := r.CheckGone(context.Background(), "c1"); !ok {
			t.Fatalf("CheckGone after Delete: %s", detail)
		}
	})
	t.Run("lock held", func(t *testing.T) {
		r, _ := newFake(t)
		f, err := os.Open(leave(t, r))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
			t.Fatal(err)
		}
		if removed, why, err := r.removeDead("c1"); removed || err != nil || !strings.Contains(why, "lock held") {
			t.Fatalf("removeDead with the lock held = %v, %q, %v; want left to runsc", removed, why, err)
		}
	})
	t.Run("process runs", func(t *testing.T) {
		r, _ := newFake(t)
		leave(t, r)
		startProc(t, "runsc-sandbox", "--root="+r.Root, "boot", "c1")
		if removed, why, err := r.removeDead("c1"); removed || err != nil || !strings.Contains(why, "processes left") {
			t.Fatalf("removeDead with a sandbox process = %v, %q, %v; want left to runsc", removed, why, err)
		}
	})
}
