package lease

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/ctld/ctld/internal/ktest"
	runscpkg "github.com/ctld/ctld/internal/runsc"
)

// TestKernelRunscPrecreatedLease pins how runsc (release 20221219) treats
// an OCI linux.cgroupsPath that names a lease ctld already made: the sandbox
// and gofer run in it, the spec's resources do not overwrite the lease's
// limits, and runsc delete leaves the (empty) cgroup for ctld to remove.
func TestKernelRunscPrecreatedLease(t *testing.T) {
	runsc := ktest.RequireBinary(t, "runsc")
	// The build on PATH (make RUNSC=current|debian) and the flags it needs.
	build, _ := runscpkg.Version(context.Background(), runsc)
	busybox := ktest.RequireBinary(t, "busybox")
	stateRoot := filepath.Join(t.TempDir(), "runsc")
	// Before kernelManager, so this check runs after the lease cleanup.
	ktest.CheckLeaks(t, ktest.SnapshotOptions{RunscRoots: []string{stateRoot}})
	m := kernelManager(t)
	ctx := t.Context()

	s := Spec{ID: "runsc", CPUMillis: 500, MemoryBytes: 512 << 20, PIDs: 64}
	if err := m.Create(ctx, s); err != nil {
		t.Fatalf("Create: %v", err)
	}

	bundle := t.TempDir()
	rootfs := filepath.Join(bundle, "rootfs")
	if err := os.MkdirAll(filepath.Join(rootfs, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(busybox)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "bin", "busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	quota, period := int64(200000), uint64(100000)
	memLimit, pidsLimit := int64(256<<20), int64(100)
	spec := specs.Spec{
		Version: specs.Version,
		Root:    &specs.Root{Path: "rootfs", Readonly: true},
		Process: &specs.Process{
			Args: []string{"/bin/busybox", "sleep", "600"},
			Cwd:  "/",
			Env:  []string{"PATH=/bin"},
		},
		Linux: &specs.Linux{
			CgroupsPath: m.CgroupsPath(s.ID),
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace},
			},
			// Different from the lease on purpose: does runsc rewrite them?
			Resources: &specs.LinuxResources{
				CPU:    &specs.LinuxCPU{Quota: &quota, Period: &period},
				Memory: &specs.LinuxMemory{Limit: &memLimit},
				Pids:   &specs.LinuxPids{Limit: &pidsLimit},
			},
		},
	}
	cfg, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}

	run := func(args ...string) (string, error) {
		full := append(append([]string{"--root", stateRoot, "--network=none"}, runscpkg.BuildFlags(build)...), args...)
		// Output goes to a file, not a pipe: the sandbox runsc create
		// starts inherits stdout/stderr and would hold a pipe open forever.
		out, err := os.CreateTemp(t.TempDir(), "out")
		if err != nil {
			t.Fatal(err)
		}
		defer out.Close()
		cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		c := exec.CommandContext(cctx, runsc, full...)
		c.Stdout, c.Stderr = out, out
		err = c.Run()
		b, _ := os.ReadFile(out.Name())
		if err != nil {
			return string(b), fmt.Errorf("runsc %s: %w: %s", strings.Join(args, " "), err, b)
		}
		return string(b), nil
	}
	const cid = "lease-probe"
	created := false
	t.Cleanup(func() {
		if created {
			_, _ = run("delete", "--force", cid)
		}
	})
	if _, err := run("create", "--bundle", bundle, cid); err != nil {
		t.Fatal(err)
	}
	created = true
	dir := m.Dir(s.ID)
	lease := map[string]string{"cpu.max": "50000 100000", "memory.max": strconv.Itoa(512 << 20), "pids.max": "64"}
	checkLimits := func(when string) {
		for name, want := range lease {
			if got := readFile(t, filepath.Join(dir, name)); got != want {
				t.Errorf("%s: %s = %q, want the lease's %q (runsc rewrote a pre-created lease)", when, name, got, want)
			}
		}
	}
	checkLimits("after create")
	if _, err := run("start", cid); err != nil {
		t.Fatal(err)
	}
	out, err := run("state", cid)
	if err != nil {
		t.Fatal(err)
	}
	var state struct{ Pid int }
	if err := json.Unmarshal([]byte(out), &state); err != nil || state.Pid == 0 {
		t.Fatalf("parse runsc state %q: %v", out, err)
	}
	procs := strings.Fields(readFile(t, filepath.Join(dir, "cgroup.procs")))
	if !slices.Contains(procs, strconv.Itoa(state.Pid)) {
		t.Fatalf("sandbox pid %d not in the lease: cgroup.procs %v", state.Pid, procs)
	}
	// The gofer is in the lease too, so the lease accounts for all of runsc.
	if len(procs) < 2 {
		t.Errorf("lease holds %v, want the sandbox and the gofer", procs)
	}
	checkLimits("after start")
	t.Logf("runsc joined the pre-created lease: procs %v, sandbox pid %d", procs, state.Pid)

	if _, err := run("kill", cid, "KILL"); err != nil {
		t.Fatal(err)
	}
	if _, err := run("delete", "--force", cid); err != nil {
		t.Fatal(err)
	}
	created = false
	// runsc does not own a cgroup it did not create: the lease stays, now
	// empty, for ctld to remove and prove gone.
	if ok, detail := m.CheckGone(ctx, s.ID); ok {
		t.Fatalf("runsc delete removed the pre-created lease (%s); ctld's Remove expects to own it", detail)
	}
	if err := m.waitEmpty(ctx, mustRoot(t, m), m.rel(s.ID)); err != nil {
		t.Fatalf("lease not empty after runsc delete: %v", err)
	}
	if err := m.Remove(ctx, s.ID); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if ok, detail := m.CheckGone(ctx, s.ID); !ok {
		t.Fatalf("CheckGone: %s", detail)
	}
}

func mustRoot(t *testing.T, m *Manager) *rootFS {
	t.Helper()
	r, err := m.open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}
